"""`sensegraph init`: the files of a new project folder."""
from __future__ import annotations

import shutil
from pathlib import Path

from .config import SETTINGS_FILE
from .prompts import LANGUAGES, PACKAGE_DIR as PROMPTS_DIR

TEMPLATES = Path(__file__).parent / "templates"
DEMO_DIR = Path(__file__).parent / "demo"

# The demo must finish in minutes on a 2-core laptop with the 1.5B model: smaller text units
# and no gleaning keep the number and length of calls down. Users see these lines in the file.
DEMO_SETTINGS = {
    "  size: 600                    # tokens per text unit (the paper's default)":
        "  size: 300                    # demo: small units so the embedded model is quick (paper: 600)",
    "  max_gleanings: 1             # extra rounds asking for missed entities":
        "  max_gleanings: 0             # demo: no gleaning, for speed (default 1)",
    "  max_entities: 25             # per answer (a JSON-schema bound that stops small models looping)":
        "  max_entities: 15             # demo: per answer, sized for 300-token units (default 25)",
    "  max_relationships: 30":
        "  max_relationships: 15        # demo (default 30)",
}


def init_project(root: Path, *, force: bool = False, demo: bool = False) -> list[str]:
    """Write settings.yaml, .env, input/ and prompts/<lang>/*.txt under `root`."""
    root = Path(root)
    targets = [root / SETTINGS_FILE, root / ".env", root / "prompts"]
    existing = [str(p) for p in targets if p.exists()]
    if existing and not force:
        raise FileExistsError(f"{', '.join(existing)} already exist; pass --force to overwrite them")
    root.mkdir(parents=True, exist_ok=True)
    settings = (TEMPLATES / "settings.yaml").read_text(encoding="utf-8")
    if demo:
        for old, new in DEMO_SETTINGS.items():
            settings = settings.replace(old, new)
    (root / SETTINGS_FILE).write_text(settings, encoding="utf-8")
    shutil.copy(TEMPLATES / "env.template", root / ".env")
    (root / "input").mkdir(exist_ok=True)
    for lang in LANGUAGES:
        dest = root / "prompts" / lang
        dest.mkdir(parents=True, exist_ok=True)
        for f in sorted((PROMPTS_DIR / lang).glob("*.txt")):
            shutil.copy(f, dest / f.name)
    return [SETTINGS_FILE, ".env", "input/", "prompts/en/", "prompts/zh/"]
