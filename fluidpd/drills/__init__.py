"""Operational drills against a live deployment: role switches under load, a killed worker,
router overhead. Each returns plain data and the ``fluidpd drill`` command writes it as JSON;
the tests run the same drills at a small scale and assert their correctness outcomes."""
