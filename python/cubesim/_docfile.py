"""Reading a small JSON (or YAML) document a user names: bounded in size, errors that name the file."""
import json
from pathlib import Path


def read_document(path, max_bytes, what, error=ValueError, yaml_ok=False):
    """The parsed document at `path` (YAML when yaml_ok and the suffix is .yaml/.yml, else JSON).
    `error` (a ValueError class) names the file and the problem: unreadable, over max_bytes, not
    UTF-8, not JSON/YAML. `what` names the document in the size message ("a recipe")."""
    path = Path(path)
    try:
        if path.is_file() and path.stat().st_size > max_bytes:
            raise error(f"{path}: {path.stat().st_size} bytes; {what} is at most {max_bytes}")
        data = path.read_bytes()[:max_bytes + 1]
    except OSError as e:
        raise error(f"{path}: cannot read it ({e.strerror})") from None
    if len(data) > max_bytes:
        raise error(f"{path}: more than {max_bytes} bytes; {what} is at most that")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{path}: not UTF-8 text (byte {e.start})") from None
    if yaml_ok and path.suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise error(f"{path}: YAML needs PyYAML (apt-get install python3-yaml); or write JSON") from None
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise error(f"{path}: not YAML: {e}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise error(f"{path}: not JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except RecursionError:
        raise error(f"{path}: nested too deeply") from None
