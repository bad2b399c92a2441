"""The model directory the embedded default serves with (``make run``; no ``--model-dir``).

The ``sim`` engine needs no weights, but every serving path needs a real tokenizer: the router
tokenizes and renders chat with it, the decode sidecar detokenizes and stops with it. So the
package ships a small one: the Llama-family byte-level BPE tokenizer of
``fluidpd.modeldir.synthetic`` (1,024 ids trained on its fixed corpus, Llama-3 special tokens
and chat template), with a ``config.json`` and ``generation_config.json`` that describe it. Nothing
is downloaded or written at start; ``write_embedded`` regenerates the files byte for byte
(a test checks that the shipped ones are current).
"""

from __future__ import annotations

import json
from pathlib import Path

from fluidpd.modeldir.model_dir import ModelDir, load_model_dir
from fluidpd.modeldir.synthetic import SPECIALS, write_tokenizer

EMBEDDED_DIR = Path(__file__).with_name("embedded")
VOCAB = 1024
#: Large enough that the serving profile's context limit is what bounds a request.
MAX_POSITIONS = 131072


def write_embedded(out: str | Path) -> None:
    out = Path(out)
    vocab = write_tokenizer(out, "llama", "bytelevel", VOCAB, model_max_length=MAX_POSITIONS)
    tok = json.loads((out / "tokenizer.json").read_text(encoding="utf-8"))
    ids = {t["content"]: t["id"] for t in tok["added_tokens"]}
    specials = SPECIALS["llama"]
    bos = ids[specials.bos] if specials.bos else None
    eos = [ids[t] for t in specials.eos]
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab,
        "max_position_embeddings": MAX_POSITIONS,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "_comment": "FluidPD's embedded tokenizer for the sim engine; there are no weights.",
    }
    gen = {"bos_token_id": bos, "eos_token_id": eos, "pad_token_id": ids[specials.pad]}
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")


def resolve_model_dir(path: str | Path | None) -> ModelDir:
    """``--model-dir`` loaded and checked, or the embedded default when none is given."""
    return load_model_dir(EMBEDDED_DIR if path is None else path)


if __name__ == "__main__":  # python -m fluidpd.modeldir.embedded: refresh the shipped files
    write_embedded(EMBEDDED_DIR)
