"""Configuration: a named config from a YAML file, overridden from the command line.

    params = YParams("config/UNet.yaml", "demo")
    params.update({"num_epochs": 2})
    params.num_epochs, params["crop_size"]

The YAML file uses anchors and merge keys for inheritance (``<<: *base``) and is read with the
safe loader. On the command line every key of the config can be overridden as ``--key=value``
or ``--key value``; values are parsed as YAML (``--crop_size=32`` is an int, ``--device=cpu`` a
string, ``--nbody_vector_channels=[1,2,3]`` a list), and a bare ``--flag`` sets a key to true.
Unknown keys and config names are refused with the closest valid name.
"""
import difflib
import logging
import os

import yaml

from utils.errors import UserError

# Options of the command line that choose the run rather than configure the training.
RUN_OPTIONS = {
    "yaml_config": "config/UNet.yaml",
    "config": "base",
    "run_num": "00",
    "resume": False,
    # Sets global_batch_size = world_size * local_batch_size (as in the original tutorial).
    "local_batch_size": None,
}

CHOICES = {
    "data_loader_config": ("synthetic", "inmem", "lowmem", "gpu-inmem", "dali-lowmem"),
    "gpu_inmem_dtype": ("float32", "bfloat16", "float16"),
    "augment": ("full", "rotations", "none"),
    "lr_scaling": ("none", "sqrt", "linear"),
    "amp_mode": ("none", "bf16", "fp16"),
    "jit_mode": ("none", "script", "compile"),
    "compile_mode": ("default", "reduce-overhead", "max-autotune"),
    "profiler": ("none", "torch"),
    "parallel": ("ddp", "fsdp"),
    "ddp_comm_hook": ("none", "fp16", "bf16"),
    "device": ("auto", "cuda", "cpu"),
}
POSITIVE_INTS = ("crop_size", "Nsamples", "Nsamples_val", "num_epochs", "global_batch_size",
                 "base_batch_size", "base_channels", "bucket_cap_mb", "profile_start_epoch", "profile_steps",
                 "memory_snapshot_steps", "dist_timeout_s", "graph_warmup_steps")
NON_NEGATIVE = ("num_data_workers", "warmup_steps", "start_lr", "end_lr", "lambda_rho")


def closest(name, valid):
    """'did you mean' text for a mistyped name."""
    match = difflib.get_close_matches(name, valid, n=1)
    return f" Did you mean '{match[0]}'?" if match else ""


class YParams:
    """A named configuration with attribute access (``params.crop_size``) and ``update(dict)``."""

    def __init__(self, yaml_filename, config_name):
        self.yaml_filename = str(yaml_filename)
        self.config_name = config_name
        try:
            with open(yaml_filename) as f:
                configs = yaml.safe_load(f)
        except FileNotFoundError:
            raise UserError(f"The config file {yaml_filename} does not exist. Pass --yaml_config="
                            "config/UNet.yaml (the default) or the path of your own copy.") from None
        except yaml.YAMLError as error:
            raise UserError(f"The config file {yaml_filename} is not valid YAML: {error}") from None
        if not isinstance(configs, dict) or config_name not in configs:
            names = sorted(configs) if isinstance(configs, dict) else []
            raise UserError(f"There is no config '{config_name}' in {yaml_filename}.{closest(config_name, names)}"
                            f" Valid configs: {', '.join(names)}.")
        self._params = dict(configs[config_name])

    def __getattr__(self, key):
        params = self.__dict__.get("_params", {})
        if key in params:
            return params[key]
        raise AttributeError(f"no config key '{key}'")

    def __getitem__(self, key):
        return self._params[key]

    def __setitem__(self, key, value):
        self._params[key] = value

    def __contains__(self, key):
        return key in self._params

    def get(self, key, default=None):
        return self._params.get(key, default)

    def keys(self):
        return self._params.keys()

    def update(self, new_params):
        self._params.update(new_params)

    def to_dict(self):
        return dict(self._params)

    def log(self):
        """The resolved configuration, in the original tutorial's format (one ``key value`` line each)."""
        logging.info("------------------ Configuration ------------------")
        logging.info("Configuration file: %s", os.path.abspath(self.yaml_filename))
        logging.info("Configuration name: %s", self.config_name)
        for key, value in self._params.items():
            if key not in ("yaml_config", "config"):  # named on the two lines above
                logging.info("%s %s", key, value)
        logging.info("---------------------------------------------------")


def parse_command_line(argv):
    """Split ``argv`` into the run options and the config overrides, both dicts of parsed values.

    Accepts ``--key=value``, ``--key value`` and bare ``--flag`` (true). Nothing is checked
    against a config here: :func:`load_params` does that once the config is known.
    """
    options, overrides = {}, {}
    i = 0
    while i < len(argv):
        token = argv[i]
        if not token.startswith("--") or token == "--":
            raise UserError(f"Unexpected argument '{token}'. Options look like --key=value, --key value"
                            " or --flag, e.g. python train.py --config=demo --num_epochs 2.")
        key, sep, text = token[2:].partition("=")
        if not sep:
            if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                text = argv[i + 1]
                i += 1
            else:
                text = "true"
        key = key.replace("-", "_")
        if isinstance(RUN_OPTIONS.get(key), str):
            value = text  # names stay as typed: --run_num=01 is '01', not the number 1
        else:
            try:
                value = yaml.safe_load(text) if text != "" else ""
            except yaml.YAMLError:
                value = text
        (options if key in RUN_OPTIONS else overrides)[key] = value
        i += 1
    return {**RUN_OPTIONS, **options}, overrides


def load_params(argv, world_size=1, null_defaults=None):
    """The run's configuration, resolved once: what every other part of the run reads.

    The named config with the command line's overrides applied and validated, and the run options
    (``config``, ``run_num``, ``resume``, ...) beside its keys. Resolved here: ``--local_batch_size``
    into ``global_batch_size`` (``world_size`` times it, as in the original tutorial), the keys the
    config leaves null that ``null_defaults`` gives a value (the profiling window of the script that
    runs), and ``--enable_jit`` into ``jit_mode``.
    """
    options, overrides = parse_command_line(argv)
    params = YParams(options["yaml_config"], str(options["config"]))
    for key, value in overrides.items():
        if key not in params:
            raise UserError(f"Unknown option --{key}.{closest(key, list(params.keys()) + list(RUN_OPTIONS))}"
                            f" Every key of the config can be overridden as --key=value; the keys of "
                            f"'{params.config_name}' are listed in {params.yaml_filename}.")
        params[key] = coerce(key, value, params[key])
    world_size = data_parallel_size(params.get("domain_mesh"), world_size)
    local = options["local_batch_size"]
    if local is not None:
        if not isinstance(local, int) or isinstance(local, bool) or local < 1:
            raise UserError(f"--local_batch_size={local} is invalid: it must be a positive integer.")
        params["global_batch_size"] = world_size * local
    validate(params)
    if params.global_batch_size % world_size:
        raise UserError(f"global_batch_size={params.global_batch_size} does not divide over {world_size} "
                        f"ranks. Choose a multiple of {world_size}, or set --local_batch_size instead.")
    for key, value in (null_defaults or {}).items():
        if params.get(key) is None:
            params[key] = value
    if params.get("enable_jit") and params.get("jit_mode") == "none":
        params["jit_mode"] = "script"  # the original's --enable_jit: a TorchScript-fused loss
    params._params = {**options, **params._params}  # one object: the run options first, as config.yaml lists them
    return params


def data_parallel_size(domain_mesh, world_size):
    """The ranks that split the global batch: under ``--domain_mesh`` the ranks of a domain group share
    their samples, so the batch splits over the data-parallel groups only. A mesh that does not divide
    the world is left to utils.distributed.check_domain_options to refuse."""
    try:
        size = domain_mesh[0] * domain_mesh[1] * domain_mesh[2]
    except (TypeError, IndexError):
        return world_size
    return world_size // size if isinstance(size, int) and size >= 1 and world_size % size == 0 else world_size


def coerce(key, value, default):
    """The override converted to the type of the config's value, or a UserError saying why not."""
    expected = type(default)
    if default is None or isinstance(value, expected) and not (expected is int and isinstance(value, bool)):
        return value
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if expected is float and isinstance(value, str):
        try:
            return float(value)  # YAML 1.1 reads 1e-3 (no dot) as a string
        except ValueError:
            pass
    if expected is bool and isinstance(value, str) and value.lower() in ("yes", "no", "on", "off"):
        return value.lower() in ("yes", "on")
    if expected is str and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise UserError(f"--{key}={value!r} has the wrong type: '{key}' takes a {expected.__name__}"
                    f" (the config's value is {default!r}).")


def validate(params):
    """Refuse values that cannot work, before anything runs or is written."""
    for key, choices in CHOICES.items():
        if key in params and params[key] not in choices:
            raise UserError(f"--{key}={params[key]} is not a valid choice: use one of {', '.join(choices)}.")
    for key in POSITIVE_INTS:  # null: the entry point's default (the profiling window)
        value = params.get(key)
        if value is not None and not (isinstance(value, int) and not isinstance(value, bool) and value > 0):
            raise UserError(f"--{key}={params[key]} is invalid: '{key}' must be a positive integer.")
    for key in NON_NEGATIVE:
        if key in params and params[key] < 0:
            raise UserError(f"--{key}={params[key]} is invalid: '{key}' must not be negative.")
    for key in ("nbody_vector_channels", "hydro_vector_channels"):
        channels = params[key]
        n_channels = params.N_in_channels if key.startswith("nbody") else params.N_out_channels
        if not (isinstance(channels, list) and (channels == [] or len(channels) == 3)
                and all(isinstance(c, int) and 0 <= c < n_channels for c in channels)):
            raise UserError(f"--{key}={channels} is invalid: give the three channels holding the velocity"
                            f" components along D, H, W (each below {n_channels}), or [] for none.")
    if params.Nsamples < params.global_batch_size:
        raise UserError(f"Nsamples={params.Nsamples} is smaller than global_batch_size="
                        f"{params.global_batch_size}: an epoch would have no step. Raise --Nsamples or"
                        " lower the batch size.")
