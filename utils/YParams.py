"""Configuration: a named config from a YAML file, overridden from the command line.

    params = YParams("config/UNet.yaml", "demo")
    params.update({"num_epochs": 2})
    params.num_epochs, params["crop_size"]

The YAML file uses anchors and merge keys for inheritance (``<<: *base``). It is read as YAML 1.2
with ruamel.yaml's safe loader, as the original tutorial reads it: ``1e-3`` is a number (PyYAML's
YAML 1.1 would make it a string), and the string ``None`` means null, as in the original. On the
command line every key of the config can be overridden as ``--key=value`` or ``--key value``;
values are read by the same loader (``--crop_size=32`` is an int, ``--start_lr=1e-3`` a float,
``--device=cpu`` a string, ``--nbody_vector_channels=[1,2,3]`` a list), and a bare ``--flag`` sets
a boolean key to true. Unknown keys and config names are refused with the closest valid name;
``--help`` lists every option with its value in the chosen config.
"""
import difflib
import io
import logging
import math
import os
import re
import sys

from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from utils.errors import UserError

# Options of the command line that choose the run rather than configure the training.
RUN_OPTIONS = {
    "yaml_config": "config/UNet.yaml",
    "config": "base",
    "run_num": "00",
    "resume": False,
    # Sets global_batch_size = world_size * local_batch_size (as in the original tutorial).
    "local_batch_size": None,
    # With --resume: the options whose changes may alter the run's learning-rate schedule (all when bare).
    "allow_changes": False,
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
                 "memory_snapshot_steps", "dist_timeout_s", "graph_warmup_steps", "grad_accum_steps")
# Keys that take a name or a list of names: --exact_forms=auto, or the layers themselves, --exact_forms=[down.0.0,last].
NAME_OR_LIST = ("exact_forms",)
NON_NEGATIVE = ("num_data_workers", "warmup_steps", "start_lr", "end_lr", "lambda_rho", "checkpoint_interval_s")

# What each run option means, for --help (the config keys are described by their comments in the YAML file).
RUN_OPTION_HELP = {
    "config": "the named config of the YAML file to train with",
    "yaml_config": "the YAML file of configs (relative to the folder you run from)",
    "run_num": "names the run directory <expdir>/<config>/<N>GPU|<N>CPU/<run_num>/",
    "resume": "continue the run in that directory from its checkpoint, with its own options",
    "local_batch_size": "per-rank batch; sets global_batch_size = world size x this",
    "allow_changes": "with --resume: let these options (all when bare) change the schedule, e.g. num_epochs",
}


def yaml_1_2():
    """The loader of every config value: YAML 1.2, safe (plain data only), pure Python."""
    return YAML(typ="safe", pure=True)


def read_yaml(text):
    """``text`` (a string or an open file) as plain data; the string 'None' becomes None, as in the original."""
    return none_for_none_string(yaml_1_2().load(text))


def none_for_none_string(value):
    if value == "None":
        return None
    if isinstance(value, dict):
        return {key: none_for_none_string(item) for key, item in value.items()}
    if isinstance(value, list):
        return [none_for_none_string(item) for item in value]
    return value


def write_yaml(data, stream):
    """``data`` as block-style YAML, keys in the given order (config.yaml of a run)."""
    writer = YAML(typ="safe", pure=True)
    writer.default_flow_style = False
    writer.sort_base_mapping_type_on_output = False
    writer.dump(data, stream)


def closest(name, valid):
    """'did you mean' text for a mistyped name: the closest spelling, or else the names that hold it
    as a word (``lr``: ``start_lr``, ``end_lr``)."""
    match = difflib.get_close_matches(name, valid, n=1)
    if match:
        return f" Did you mean '{match[0]}'?"
    holding = sorted((key for key in valid if name in key.split("_") or len(name) > 3 and name in key),
                     key=lambda key: not key.endswith(name))  # start_lr before lr_scaling
    if not holding:
        return ""
    names = [f"'{key}'" for key in holding[:3]]
    return f" Did you mean {' or '.join([', '.join(names[:-1]), names[-1]] if len(names) > 1 else names)}?"


class YParams:
    """A named configuration with attribute access (``params.crop_size``) and ``update(dict)``."""

    def __init__(self, yaml_filename, config_name):
        self.yaml_filename = str(yaml_filename)
        self.config_name = config_name
        try:
            with open(yaml_filename) as f:
                configs = read_yaml(f)
        except FileNotFoundError:
            raise UserError(missing_config_file(yaml_filename)) from None
        except YAMLError as error:
            raise UserError(f"The config file {yaml_filename} is not valid YAML: {error}") from None
        if not isinstance(configs, dict) or config_name not in configs:
            names = sorted(configs) if isinstance(configs, dict) else []
            raise UserError(f"There is no config '{config_name}' in {yaml_filename}.{closest(config_name, names)}"
                            f" Valid configs: {', '.join(names)}.")
        self._params = dict(configs[config_name])
        self.overridden = []  # the keys the command line set, in its order

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

    def log(self, overridden=()):
        """The resolved configuration: in out.log, the original tutorial's block (one ``key value`` line
        each); on the screen, one line with the config's name and the options the command line set."""
        from utils.logging_utils import FILE_ONLY, SCREEN_ONLY

        logging.info("------------------ Configuration ------------------", extra=FILE_ONLY)
        logging.info("Configuration file: %s", os.path.abspath(self.yaml_filename), extra=FILE_ONLY)
        logging.info("Configuration name: %s", self.config_name, extra=FILE_ONLY)
        for key, value in self._params.items():
            if key not in ("yaml_config", "config"):  # named on the two lines above
                logging.info("%s %s", key, value, extra=FILE_ONLY)
        logging.info("---------------------------------------------------", extra=FILE_ONLY)
        changed = ", ".join(f"{key}={self._params[key]}" for key in dict.fromkeys(self.overridden) if key in self._params)
        logging.info("Configuration %s of %s%s; all %d options in the run's out.log and config.yaml",
                     self.config_name, self.yaml_filename, f", with {changed}" if changed else "",
                     len(self._params), extra=SCREEN_ONLY)


def missing_config_file(yaml_filename):
    """What to do when the config file is not there: most often, the run did not start from the top level."""
    repository = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ours = os.path.join(repository, RUN_OPTIONS["yaml_config"])
    if not os.path.isabs(yaml_filename) and os.path.exists(os.path.join(repository, yaml_filename)):
        return (f"The config file {yaml_filename} is not in the folder you run from ({os.getcwd()}): its "
                f"path, and the data paths in the configs, are relative to the repository's top level. "
                f"Run from there (cd {repository}), or pass --yaml_config={os.path.join(repository, yaml_filename)} "
                "and absolute data paths.")
    return (f"The config file {yaml_filename} does not exist. Pass --yaml_config={ours} (the tutorial's "
            "configs) or the path of your own copy.")


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
        bare = False
        if not sep:
            if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                text = argv[i + 1]
                i += 1
            else:
                text, bare = "true", True
        key = key.replace("-", "_")
        if isinstance(RUN_OPTIONS.get(key), str):
            value = text  # names stay as typed: --run_num=01 is '01', not the number 1
        else:
            try:
                value = read_yaml(text) if text != "" else ""
            except YAMLError:
                value = text
        if bare:
            value = BareFlag()
        (options if key in RUN_OPTIONS else overrides)[key] = value
        i += 1
    return {**RUN_OPTIONS, **options}, overrides


def load_params(argv, world_size=1, null_defaults=None, saved=None):
    """The run's configuration, resolved once: what every other part of the run reads.

    The named config with the command line's overrides applied and validated, and the run options
    (``config``, ``run_num``, ``resume``, ...) beside its keys. Resolved here: ``--local_batch_size``
    into ``global_batch_size`` (``world_size`` times it, as in the original tutorial), the keys the
    config leaves null that ``null_defaults`` gives a value (the profiling window of the script that
    runs), and ``--enable_jit`` into ``jit_mode``. ``saved``, a resumed run's recorded options
    (utils/runs.py's ``load_run_params``), replaces the config's values before the command line's
    overrides apply: a resumed run keeps its own options unless they are given again.
    """
    if wants_help(argv):
        try:
            print(help_text(argv), flush=True)
        except BrokenPipeError:  # read by `head`, which has seen enough
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(0)
    options, overrides = parse_command_line(argv)
    options = {key: True if isinstance(value, BareFlag) else value for key, value in options.items()}
    params = YParams(options["yaml_config"], str(options["config"]))
    params.update({key: value for key, value in (saved or {}).items() if key in params})
    for key, value in overrides.items():
        if key not in params:
            raise UserError(f"Unknown option --{key}.{closest(key, list(params.keys()) + list(RUN_OPTIONS))}"
                            f" Every key of the config can be overridden as --key=value; the keys of "
                            f"'{params.config_name}' are listed in {params.yaml_filename}.")
        params[key] = coerce(key, value, params[key])
        params.overridden.append(key)
    world_size = data_parallel_size(params.get("domain_mesh"), world_size)
    local = options["local_batch_size"]
    if local is not None:
        if not isinstance(local, int) or isinstance(local, bool) or local < 1:
            raise UserError(f"--local_batch_size={local} is invalid: it must be a positive integer.")
        params["global_batch_size"] = world_size * local
        params.overridden.append("global_batch_size")
    validate(params)
    if params.global_batch_size % world_size:
        raise UserError(f"global_batch_size={params.global_batch_size} does not divide over {world_size} "
                        f"ranks. Choose a multiple of {world_size}, or set --local_batch_size instead.")
    check_micro_batches(params, params.global_batch_size // world_size)
    for key, value in (null_defaults or {}).items():
        if params.get(key) is None:
            params[key] = value
    if params.get("enable_jit") and params.get("jit_mode") == "none":
        params["jit_mode"] = "script"  # the original's --enable_jit: a TorchScript-fused loss
    params._params = {**options, **params._params}  # one object: the run options first, as config.yaml lists them
    return params


def check_micro_batches(params, local_batch_size):
    """Refuse a --grad_accum_steps that does not split each rank's batch into equal micro-batches."""
    steps = params.get("grad_accum_steps", 1)
    if local_batch_size % steps:
        divisors = [k for k in range(1, local_batch_size + 1) if local_batch_size % k == 0]
        raise UserError(f"--grad_accum_steps={steps} does not divide the local batch of {local_batch_size} "
                        f"samples per rank (global_batch_size={params.global_batch_size}) into equal "
                        f"micro-batches. Use a divisor of {local_batch_size} ({', '.join(map(str, divisors))}), "
                        "or change the batch size.")


class BareFlag:
    """The value of an option given without one (``--noddp``): true for a boolean key, an error otherwise."""

    def __bool__(self):
        return True

    def __eq__(self, other):
        return other is True or isinstance(other, BareFlag)

    __hash__ = None

    def __repr__(self):
        return "True"


TYPE_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string", list: "a list"}


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
    if isinstance(value, BareFlag):
        if expected is bool or default is None:
            return True
        raise UserError(f"--{key} needs a value: '{key}' takes {TYPE_NAMES.get(expected, expected.__name__)}, "
                        f"e.g. --{key}={default} (the config's value).")
    if default is None or isinstance(value, expected) and not (expected is int and isinstance(value, bool)):
        return value
    if key in NAME_OR_LIST and isinstance(value, (str, list)):
        return value
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if expected is bool and isinstance(value, str) and value.lower() in ("yes", "no", "on", "off"):
        return value.lower() in ("yes", "on")
    if expected is str and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise UserError(f"--{key}={value} has the wrong type: '{key}' takes "
                    f"{TYPE_NAMES.get(expected, expected.__name__)} (the config's value is {default!r}).")


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
        if key in params and not (math.isfinite(params[key]) and params[key] >= 0):
            raise UserError(f"--{key}={params[key]} is invalid: '{key}' must be finite and must not be negative.")
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


# ----------------------------------------------------------------------------- --help

TYPE_WORDS = {bool: "BOOL", int: "INT", float: "FLOAT", str: "TEXT", list: "LIST"}


def wants_help(argv):
    return "-h" in argv or "--help" in argv


def help_text(argv, program=None):
    """``--help``: the run options, then every key of the chosen config (``--config``, default base)
    grouped as in the YAML file, each with its type or choices, its value in that config and the
    comment that describes it in the file."""
    program = program or os.path.basename(sys.argv[0]) or "train.py"
    yaml_filename = option_value(argv, "yaml_config")
    params = YParams(yaml_filename, str(option_value(argv, "config")))
    with open(yaml_filename) as f:
        configs = read_yaml(f)
    lines = [f"usage: python {program} [--config=NAME] [--key=value | --key value | --flag] ...", "",
             "Every key of the config can be overridden on the command line; values are read as YAML 1.2",
             "(2e-4, true, [2,1,1], null). Names must be given in full.", "", "run options:"]
    run_values = {**RUN_OPTIONS, "config": params.config_name, "yaml_config": yaml_filename}
    for key, value in run_values.items():
        kind = ("NAME" if isinstance(RUN_OPTIONS[key], str) else
                {"resume": "BOOL", "allow_changes": "BOOL|NAMES"}.get(key, "INT"))
        extra = f": {', '.join(configs)}" if key == "config" else ""
        lines.append(help_line(key, kind, value, RUN_OPTION_HELP[key] + extra))
    section = None
    descriptions = key_descriptions(yaml_filename)
    for key, value in params.to_dict().items():
        group, text = descriptions.get(key, ("other", ""))
        if group != section:
            section = group
            lines += ["", f"{group} (config '{params.config_name}' of {yaml_filename}):"]
        kind = "|".join(CHOICES[key]) if key in CHOICES else TYPE_WORDS.get(type(value), "VALUE")
        lines.append(help_line(key, kind, value, text))
    return "\n".join(lines)


def help_line(key, kind, value, text):
    shown = "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
    return f"  --{key}={kind}".ljust(40) + f" {shown}".ljust(22) + f" {text}".rstrip()


def option_value(argv, name):
    """A run option's value from a command line that may not parse (it asks for --help)."""
    for index, token in enumerate(argv):
        if token.startswith(f"--{name}="):
            return token.split("=", 1)[1]
        if token == f"--{name}" and index + 1 < len(argv):
            return argv[index + 1]
    return RUN_OPTIONS[name]


def key_descriptions(yaml_filename):
    """{key: (section, comment)} from the YAML file's text: the comment on a key's first appearance
    (and the comment lines that continue it), under the latest ``# --- section ---`` line."""
    described, section, last = {}, "other", None
    with open(yaml_filename) as f:
        for line in f:
            header = re.match(r"\s+# --- (.+?) ---", line)
            entry = re.match(r"  (\w+):[^#]*(?:#\s*(.*))?$", line.rstrip())
            continued = re.match(r"\s{4,}#\s*(.*)$", line.rstrip())
            if header:
                section, last = header.group(1), None
            elif entry:
                key = entry.group(1)
                last = None if key in described else key
                described.setdefault(key, (section, (entry.group(2) or "").strip()))
            elif continued and last:
                group, text = described[last]
                described[last] = (group, f"{text} {continued.group(1).strip()}")
            else:
                last = None
    return described
