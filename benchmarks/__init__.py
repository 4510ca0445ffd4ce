import utils.env_check  # noqa: F401  `python -m benchmarks.<tool>` without the project's packages: a one-line hint
