from sensegraph.config import Settings, load_settings
from sensegraph.index.extract import graph_schema
from sensegraph.llm import strict_schema
from sensegraph.project import DEMO_SETTINGS, init_project


def test_template_settings_equal_the_defaults(tmp_path):
    init_project(tmp_path)
    assert load_settings(tmp_path).model_dump(exclude={"root"}) == Settings().model_dump(exclude={"root"})


def test_demo_project_gets_its_faster_settings(tmp_path):
    init_project(tmp_path, demo=True)
    text = (tmp_path / "settings.yaml").read_text()
    assert all(new in text for new in DEMO_SETTINGS.values())
    s = load_settings(tmp_path)
    assert s.chunks.size == 300 and s.extraction.max_gleanings == 0 and s.extraction.max_entities == 15


def test_extraction_schema_bounds_the_lists():
    schema = strict_schema(graph_schema(["person"], 7, 9))
    assert schema["properties"]["entities"]["maxItems"] == 7
    assert schema["properties"]["relationships"]["maxItems"] == 9
