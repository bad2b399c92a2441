"""Find, read and validate model x GPU profiles (YAML files; the calibrated ones ship in
``fluidpd/shipped_profiles/``).

``fluidpd.core.profile`` defines the schema and does no I/O. File access lives here, and every
failure (missing file, bad YAML, schema violation) becomes a one-line :class:`ProfileError` that
names the file and the offending field, so a CLI can print it as is instead of a traceback.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from fluidpd.core.profile import Profile

__all__ = [
    "PROFILES_DIR_ENV",
    "ProfileError",
    "available_profiles",
    "load_profile_file",
    "profiles_dir",
    "resolve_profile",
]

PROFILES_DIR_ENV = "FLUIDPD_PROFILES_DIR"
#: The calibrated profiles shipped in the package (package data).
SHIPPED_PROFILES = Path(__file__).resolve().parent / "shipped_profiles"

# Long reprs of bad values would swamp the one-line message.
_MAX_VALUE_REPR = 60


class ProfileError(ValueError):
    """A profile could not be found, read or validated. The message is a single line."""


def profiles_dir() -> Path:
    """The directory holding ``<model>-<gpu>.yaml`` profiles.

    ``$FLUIDPD_PROFILES_DIR`` lets experiments point at their own calibrations without editing
    the shipped ones. Otherwise they are the package's data, ``fluidpd/shipped_profiles/``, so an
    installed wheel finds them as a checkout does (``profiles/`` at the repository root links
    there, for paths such as ``--profile profiles/llama-3.1-8b-h200.yaml``).
    """
    override = os.environ.get(PROFILES_DIR_ENV, "").strip()
    if override:
        return Path(override).expanduser()
    return SHIPPED_PROFILES


def available_profiles() -> list[str]:
    """Sorted stems of the ``*.yaml`` files in :func:`profiles_dir` (empty if it does not exist)."""
    directory = profiles_dir()
    if not directory.is_dir():
        return []
    return sorted(path.stem for path in directory.glob("*.yaml") if path.is_file())


def load_profile_file(path: str | Path) -> Profile:
    """Read one YAML profile and validate it against :class:`Profile`.

    Raises:
        ProfileError: the file is missing or unreadable, is not valid YAML, is not a mapping, or
            breaks the schema. The message names the file and, for schema errors, the first bad
            field (dotted path) and how many other errors there are.
    """
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ProfileError(f"{file}: profile file not found") from None
    except IsADirectoryError:
        raise ProfileError(f"{file}: is a directory, not a profile file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileError(_one_line(f"{file}: cannot read profile file: {exc}")) from None
    return parse_profile(text, file)


def parse_profile(text: str, source: str | Path) -> Profile:
    """Validate one YAML profile's text (``source`` names it in errors: a file, a ConfigMap).

    Raises:
        ProfileError: as :func:`load_profile_file`, for everything after reading the file.
    """
    try:
        data = yaml.load(text, Loader=_StrictLoader)
    except yaml.YAMLError as exc:
        raise ProfileError(_one_line(f"{source}: {_describe_yaml_error(exc)}")) from None

    if not isinstance(data, dict):
        raise ProfileError(
            f"{source}: expected a mapping of profile fields at the top level, got {_kind(data)}"
        )

    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        raise ProfileError(_describe_validation_error(source, exc)) from None


def resolve_profile(model: str | None, gpu: str | None, profile_file: str | None) -> Profile:
    """Pick the profile for a run: an explicit file wins, else ``<model>-<gpu>.yaml``.

    Raises:
        ProfileError: neither a file nor both of model and gpu were given, no profile exists for
            that combination (the message lists the available ones), or the file found declares a
            different model or gpu than its name says.
    """
    if profile_file:
        return load_profile_file(profile_file)

    if not model or not gpu:
        raise ProfileError(
            f"need a profile file or both a model and a gpu (got model={model!r}, gpu={gpu!r}); "
            f"{_available_text()}"
        )
    for label, value in (("model", model), ("gpu", gpu)):
        # The name becomes part of a path, so a separator would escape profiles_dir().
        if "/" in value or os.sep in value:
            raise ProfileError(f"invalid {label} name {value!r}: must not contain a path separator")

    path = profiles_dir() / f"{model}-{gpu}.yaml"
    if not path.is_file():
        raise ProfileError(
            f"no profile for model {model!r} on gpu {gpu!r} ({path} not found); {_available_text()}"
        )
    profile = load_profile_file(path)
    # A copied-and-renamed file that still says the old model would silently run the wrong
    # coefficients, so the name and the contents must agree.
    if (profile.model, profile.gpu) != (model, gpu):
        raise ProfileError(
            f"{path}: declares model {profile.model!r} / gpu {profile.gpu!r}, "
            f"but its file name says model {model!r} / gpu {gpu!r}"
        )
    return profile


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys.

    Plain PyYAML keeps the last of two equal keys without a word, so an edited profile could
    silently lose a coefficient.
    """


def _construct_mapping_no_duplicates(loader: yaml.SafeLoader, node: yaml.MappingNode) -> Any:
    loader.flatten_mapping(node)  # resolve "<<" merges first so merged keys count too
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            duplicate = key in seen
        except TypeError:
            continue  # an unhashable key: construct_mapping below reports it properly
        if duplicate:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping",
                node.start_mark,
                f"found duplicate key {key!r}",
                key_node.start_mark,
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=True)


_StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping_no_duplicates
)


def _describe_yaml_error(exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "malformed YAML"
        if mark is not None:
            return f"YAML error at line {mark.line + 1}, column {mark.column + 1}: {problem}"
        return f"YAML error: {problem}"
    return f"YAML error: {exc}"


def _describe_validation_error(file: str | Path, exc: ValidationError) -> str:
    errors = exc.errors(include_url=False)
    first = errors[0]
    loc = tuple(first["loc"])
    where = ".".join(str(part) for part in loc) or "<top level>"
    if first["type"] == "extra_forbidden":
        allowed = _allowed_fields(loc[:-1])
        message = "unknown field" + (f" (allowed: {', '.join(allowed)})" if allowed else "")
    else:
        message = first["msg"]
        value = first.get("input")
        # A missing field has no value to show, and a whole sub-mapping would be noise.
        if first["type"] != "missing" and not isinstance(value, dict | list):
            message += f" (got {_short_repr(value)})"
    more = len(errors) - 1
    tail = f" (and {more} more error{'s' if more != 1 else ''})" if more else ""
    return _one_line(f"{file}: {where}: {message}{tail}")


def _allowed_fields(parent: tuple[int | str, ...]) -> list[str]:
    """Field names of the (nested) model at ``parent``, or [] if that is not a model."""
    model: type[BaseModel] = Profile
    for part in parent:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        annotation = field.annotation if field is not None else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        model = annotation
    return list(model.model_fields)


def _available_text() -> str:
    names = available_profiles()
    if not names:
        return f"no profiles found in {profiles_dir()}"
    return f"available profiles in {profiles_dir()}: {', '.join(names)}"


def _kind(value: object) -> str:
    if value is None:
        return "an empty document"
    if isinstance(value, list):
        return "a list"
    return f"a {type(value).__name__} ({_short_repr(value)})"


def _short_repr(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _MAX_VALUE_REPR else text[: _MAX_VALUE_REPR - 3] + "..."


def _one_line(text: str) -> str:
    return " ".join(text.split())
