"""Load, validate, save and fingerprint a `RunConfig`.

    cfg = load_config("configs/kimi-k2.5.yaml", ["extract.num_tasks=64", "run_dir=/scratch/run1"])

YAML files are merged onto the dataclass schema in order, then `key=value` overrides; omegaconf
raises on unknown keys and wrong types and we re-raise with the dotted key path and the file.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from pathlib import Path

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException, ValidationError

from eagle_batch.errors import UserError
from eagle_batch.ownership import check_run, make_run_dir, write_private

from .remote_code import deprecated_flag_note
from .schema import RunConfig

RESOLVED_NAME = "config.yaml"
# The sections that determine the extracted data: their fingerprint identifies a run (config_hash).
DATA_SECTIONS = ("model", "data", "extract", "store")
# Keys of those sections that change how one command runs, never what is extracted: left out of the
# fingerprint, so a run extracted or resumed with another value is the same run (extract.check_disk=false, the
# disk check's own advice, must not make `extract` call the folder another run), and not saved in
# RUN/config.yaml (they apply to the command they are given to: a later `resume` checks the disk again).
COMMAND_KEYS = {"extract": ("check_disk",)}
# What a regeneration's plan depends on: the conversations (data), who answers them (model) and how
# (regenerate); extract and store settings do not change what it writes.
REGENERATE_SECTIONS = ("model", "data", "regenerate")
# The config a run's plan was made with (RUN/prepared/PLANNED_NAME), kept apart from RUN/config.yaml, which
# slurm.* overrides rewrite and which a user may edit: the two are compared before the plan is resumed.
PLANNED_NAME = "planned.yaml"


class ConfigError(UserError, ValueError):
    """A configuration problem, with the key path or file and what to do."""

    exit_code = 2


def _format_omegaconf_error(err: OmegaConfBaseException, source: str) -> str:
    key = getattr(err, "full_key", None) or getattr(err, "key", None)
    if isinstance(err, MissingMandatoryValue):
        return f"{source}: key '{key}' is not set; set it in a config file or as an override ({key}=...)."
    expected = expected_value(str(key)) if key else ""
    if expected and isinstance(err, ValidationError):
        # omegaconf's words are about its node types ("AnyNode is not a ListConfig"): say what the key takes.
        return f"{source}: {key} must be {expected}."
    msg = str(err).splitlines()[0] if str(err) else type(err).__name__
    # omegaconf's own sentence may end in '?' ("Did you mean: 'limit'?"): one mark ends it, not two.
    end = "" if msg.endswith((".", "?", "!")) else "."
    where = f"{source}: key '{key}'" if key else source
    return f"{where}: {msg}{end} Check the key's spelling and type against eagle_batch/config/schema.py."


# What a key takes where its type alone says too little (an id convention, a default computed from the model).
VALUE_HINTS = {
    "model.layer_ids": "a list of layer ids, e.g. model.layer_ids=[2,16,29,32] (id k = the residual stream after "
    "k decoder layers, id N = the last layer's output), or null for the EAGLE-3 default [2, N//2, N-3, N]",
}
_TYPE_WORDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
_LIST_WORDS = {int: ("integers", "[1,2]"), float: ("numbers", "[0.5,1.0]"), str: ("strings", "[a,b]")}


def expected_value(key: str) -> str:
    """What `key` (dotted, e.g. model.layer_ids) takes, in plain words; "" for a key not in the schema."""
    if key in VALUE_HINTS:
        return VALUE_HINTS[key]
    import typing
    from dataclasses import fields, is_dataclass

    cls: object = RunConfig
    for part in key.split("."):
        if not (isinstance(cls, type) and is_dataclass(cls)):
            return ""
        hints = typing.get_type_hints(cls)
        if part not in {f.name for f in fields(cls)}:
            return ""
        cls = hints[part]
    args = [a for a in typing.get_args(cls) if a is not type(None)]
    optional = type(None) in typing.get_args(cls)
    base = typing.get_origin(cls) or cls
    if base in (list, tuple) or (args and typing.get_origin(args[0]) in (list, tuple)):
        inner = typing.get_args(args[0] if optional else cls)
        plural, example = _LIST_WORDS.get(inner[0] if inner else None, ("values", "[a,b]"))
        words = f"a list of {plural}, e.g. [{example[1:-1]}]"
    elif base is dict:
        words = "a mapping of keys to values, e.g. {a: 1}"
    else:
        words = _TYPE_WORDS.get(args[0] if optional else cls, "")
    return words + (", or null" if optional and words else "")


def load_config(
    paths: str | os.PathLike | Sequence[str | os.PathLike] | None = None, overrides: Iterable[str] = ()
) -> RunConfig:
    """Merge YAML file(s) and `key=value` overrides onto the schema; return a typed RunConfig."""
    base = OmegaConf.structured(RunConfig)
    if paths is None:
        paths = []
    elif isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    # `eagle-batch CMD a.yaml b.yaml k=v`: argparse leaves b.yaml among the overrides; merge it as a file.
    overrides = list(overrides)
    more = [o for o in overrides if "=" not in o and str(o).endswith((".yaml", ".yml"))]
    paths = [*paths, *more]
    overrides = [o for o in overrides if o not in more]
    for p in paths:
        base = _merge_file(base, resolve_config_path(p))
    for ov in overrides:
        base = _merge_override(base, ov)
    try:
        cfg = OmegaConf.to_object(base)
    except OmegaConfBaseException as e:
        raise ConfigError(_format_omegaconf_error(e, "config")) from e
    assert isinstance(cfg, RunConfig)
    check_no_control_characters(cfg)
    deprecated_flag_note(cfg.model)
    # Absolute from here on: RUN/config.yaml keeps it, and a later command started from another folder (or a
    # task whose working directory is its log folder) must find the same run.
    cfg.run_dir = str(Path(cfg.run_dir).expanduser().absolute())
    return cfg


# Values that never reach a shell script, a Slurm header or a path: the chat template's own variables.
FREE_TEXT_KEYS = ("data.chat_template_kwargs.",)
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def check_no_control_characters(cfg: RunConfig) -> None:
    """ConfigError naming the key when a string setting holds a control character (a tab aside). Settings
    reach generated batch scripts, `#SBATCH` lines and paths: a newline there would end a line and start
    another (a second `#SBATCH` option, a shell command); no real value needs one."""
    for key, value in dotted_leaves(config_dict(cfg)).items():
        if key.startswith(FREE_TEXT_KEYS):
            continue
        for i, item in enumerate(value if isinstance(value, list) else [value]):
            if isinstance(item, str) and _CONTROL.search(item):
                where = f"{key}[{i}]" if isinstance(value, list) else key
                raise ConfigError(
                    f"config key '{where}' holds a control character ({_CONTROL.search(item).group()!r}) in "
                    f"{item[:80]!r}: settings reach batch scripts and #SBATCH lines, where a newline starts "
                    "another line. Remove it (a list setting takes one item per line)."
                )


def _merge_file(base: DictConfig, path: Path) -> DictConfig:
    """`base` with the YAML file at `path` merged on; the file must be a mapping of sections."""
    try:
        loaded = OmegaConf.load(path)
    except Exception as e:  # yaml errors carry line numbers
        raise ConfigError(f"{path}: not valid YAML: {e}") from e
    if not isinstance(loaded, DictConfig):
        raise ConfigError(
            f"{path}: its top level must be a mapping of sections (model:, data:, ...), not a list; "
            "see configs/demo.yaml for the layout."
        )
    try:
        return OmegaConf.merge(base, loaded)
    except OmegaConfBaseException as e:
        raise ConfigError(_format_omegaconf_error(e, str(path))) from e


def _merge_override(base: DictConfig, override: str) -> DictConfig:
    """`base` with one `key=value` merged on; an error names that override."""
    if "=" not in override:
        raise ConfigError(f"override '{override}' is not of the form key=value (e.g. extract.num_tasks=8).")
    try:
        parsed = OmegaConf.from_dotlist([override])
    except yaml.YAMLError as e:
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(
            f"override '{override}': its value is not valid YAML ({problem}); write the value as YAML, "
            "e.g. data.inputs=[a.jsonl,b.jsonl]."
        ) from e
    except OmegaConfBaseException as e:
        raise ConfigError(_format_omegaconf_error(e, f"override '{override}'")) from e
    try:
        return OmegaConf.merge(base, parsed)
    except OmegaConfBaseException as e:
        raise ConfigError(_format_omegaconf_error(e, f"override '{override}'")) from e


SHIPPED = Path(__file__).resolve().parents[1] / "configs"  # eagle_batch/configs, in the wheel too


def shipped_configs() -> list[str]:
    """The configs that come with eagle-batch, as `configs/...` names (`configs` in a checkout links here)."""
    return sorted(f"configs/{p.relative_to(SHIPPED)}" for p in SHIPPED.rglob("*.yaml"))


def resolve_config_path(path: str | os.PathLike) -> Path:
    """`path` if it is a file; else a shipped config of that name (`configs/models/kimi-k2.5.yaml`,
    `models/kimi-k2.5.yaml`), so the README's commands work from any folder with eagle-batch installed."""
    p = Path(path)
    if p.is_file():
        return p
    if p.is_dir():
        raise ConfigError(_folder_as_config(p))
    rel = Path(*p.parts[1:]) if p.parts[:1] == ("configs",) else p
    if not p.is_absolute() and (SHIPPED / rel).is_file():
        return SHIPPED / rel
    raise ConfigError(
        f"config file {p} does not exist; pass the path of a YAML file, or one of the shipped "
        f"configs: {', '.join(shipped_configs())}."
    )


def _folder_as_config(folder: Path) -> str:
    """What to say when a folder is given where a config file belongs (often a run directory)."""
    if (folder / RESOLVED_NAME).is_file():
        return (
            f"{folder} is a run directory, not a config file; pass {folder / RESOLVED_NAME} "
            "(the config the run was created with)."
        )
    return f"{folder} is a folder, not a YAML config file; pass the path of a YAML file (e.g. configs/demo.yaml)."


def to_yaml(cfg: RunConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def config_dict(cfg: RunConfig) -> dict:
    return asdict(cfg)


def dotted_leaves(d: dict, prefix: str = "") -> dict[str, object]:
    """{dotted key: value} of a nested dict; an empty dict is a leaf (a dict-valued setting with nothing set)."""
    out: dict[str, object] = {}
    for key, value in d.items():
        if isinstance(value, dict) and value:
            out.update(dotted_leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def config_hash(cfg: RunConfig, sections: Sequence[str] = DATA_SECTIONS) -> str:
    """Fingerprint of the sections that determine the extracted data (not Slurm or training knobs).

    Fields at their schema default are left out: a release that adds a field whose default keeps the
    old behaviour leaves the fingerprint of every existing run (stored in its task stores, compared on
    resume) unchanged, so an upgrade never turns a resumable run into a mismatch."""
    d, defaults = data_dict(cfg, sections), data_dict(RunConfig(), sections)
    return fingerprint(d, defaults)


def data_dict(cfg: RunConfig, sections: Sequence[str] = DATA_SECTIONS) -> dict:
    """{section: values} of `sections` without COMMAND_KEYS: what identifies the data a run produces."""
    d = config_dict(cfg)
    out = {k: dict(d[k]) for k in sections}
    for section, keys in COMMAND_KEYS.items():
        for key in keys:
            out.get(section, {}).pop(key, None)
    return out


def fingerprint(values: dict, defaults: dict) -> str:
    """sha256 (16 hex digits) of `values` without the entries equal to `defaults` (recursively)."""
    payload = json.dumps(_without_defaults(values, defaults), sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def _without_defaults(values: dict, defaults: dict) -> dict:
    out = {}
    for key, value in values.items():
        default = defaults.get(key, _MISSING)
        if isinstance(value, dict) and isinstance(default, dict):
            out[key] = _without_defaults(value, default)
        elif value != default:
            out[key] = value
    return out


_MISSING = object()


def save_config(cfg: RunConfig, run_dir: str | os.PathLike, name: str = RESOLVED_NAME) -> Path:
    """Write the resolved config into the run directory (atomically, 0600; RUN made group/other read-only),
    COMMAND_KEYS at their defaults."""
    cfg, default = copy.deepcopy(cfg), RunConfig()
    for section, keys in COMMAND_KEYS.items():
        for key in keys:
            setattr(getattr(cfg, section), key, getattr(getattr(default, section), key))
    run_dir = make_run_dir(run_dir)
    # Owner-only whatever the umask: it names code (extract.work) and shell lines (slurm.setup) run as you.
    return write_private(run_dir / name, to_yaml(cfg))


def load_run_config(run_dir: str | os.PathLike, overrides: Iterable[str] = ()) -> RunConfig:
    """The resolved config a run was created with (RUN/config.yaml), plus overrides."""
    p = Path(run_dir) / RESOLVED_NAME
    check_run(run_dir)
    if not p.is_file():
        raise ConfigError(
            f"{run_dir} is not an eagle-batch run directory (no {RESOLVED_NAME}); "
            "run `eagle-batch prepare CONFIG run_dir=...` first."
        )
    cfg = load_config(p, overrides)
    # The folder named is the run, wherever it was created: a run moved (or prepared with a relative run_dir
    # by an earlier release) still finds its own files.
    cfg.run_dir = str(Path(run_dir).expanduser().absolute())
    return cfg
