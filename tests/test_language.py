"""The corpus language: English, Chinese and Japanese told apart (Japanese by its kana), the
prompts each one gets (Japanese: the English ones, which ask for the language of the text), and
the note a Japanese corpus or question shows: in `sensegraph index`'s output and stats.json, in
`sensegraph query`'s, in prompt-tune's plan."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from mock_llm import start_mock_server
from sensegraph.cli import main as cli_main
from sensegraph.config import Settings, load_settings
from sensegraph.index.pipeline import run_index
from sensegraph.language import JAPANESE_NOTE, detect_language, language_note, resolve_language
from sensegraph.prompts import PACKAGE_DIR, load_prompt, prompt_language
from test_pipeline import settings_for, write_docs

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"

JAPANESE = {
    "prose": "夏目漱石は明治時代の小説家で、東京で生まれました。代表作には『吾輩は猫である』や『こころ』があります。",
    "katakana": "ソニーとパナソニックはテレビやカメラを作るメーカーで、どちらも大阪や東京に大きな工場を持っている。",
    "kanji-heavy news": "政府は二〇二四年度予算案を閣議決定した。総額は過去最大の百十二兆円となる見通し。",
    "with English terms": "GraphRAGは知識グラフを使う検索手法で、Microsoft Researchが二〇二四年に発表した。",
}
CHINESE = {
    "simplified": "北京是中华人民共和国的首都，也是全国的政治、文化和国际交往中心，有三千多年的建城史。",
    "traditional": "臺北是臺灣最大的城市，也是政治、經濟與文化的中心，捷運系統每天載運上百萬人次。",
    # a kana sign in a shop's name, and a katakana middle dot between the parts of a foreign name
    "one kana sign": "这家店的招牌上写着一个“の”字，店里卖日式拉面和寿司，生意很好，每天中午都有很多顾客排队。",
    "middle dot": "迈克尔・杰克逊是美国著名的流行音乐歌手，他的专辑在全世界卖出了几亿张。",
}
ENGLISH = {
    "plain": "Tokyo is the capital of Japan and one of the largest cities in the world.",
    "a Japanese word": "The greeting こんにちは is what people in Japan say during the day, as a visitor soon learns.",
}


@pytest.mark.parametrize("name", JAPANESE)
def test_japanese_is_detected_by_its_kana(name):
    assert detect_language([JAPANESE[name]]) == "ja"


@pytest.mark.parametrize("name", CHINESE)
def test_chinese_stays_chinese(name):
    assert detect_language([CHINESE[name]]) == "zh"


@pytest.mark.parametrize("name", ENGLISH)
def test_english_stays_english(name):
    assert detect_language([ENGLISH[name]]) == "en"


def test_a_real_chinese_novel_is_chinese():
    path = DATA / "xiyouji-ch01-07.txt"
    if not path.exists():
        pytest.skip("the shared corpora are not here")
    assert detect_language([path.read_text(encoding="utf-8")]) == "zh"


def test_the_language_setting_takes_ja():
    assert Settings(language="ja").language == "ja"
    assert resolve_language("ja", [CHINESE["simplified"]]) == "ja"
    assert resolve_language("auto", list(JAPANESE.values())) == "ja"
    assert resolve_language("zh", list(JAPANESE.values())) == "zh"  # what the user sets wins


def test_japanese_uses_the_english_prompts_and_a_project_override_of_them(tmp_path):
    assert prompt_language("ja") == "en" and prompt_language("zh") == "zh" and prompt_language("fr") == "en"
    for name in ("extract_graph", "community_report", "query_answer"):
        assert load_prompt(name, "ja") == load_prompt(name, "en")
    (tmp_path / "prompts" / "en").mkdir(parents=True)
    (tmp_path / "prompts" / "en" / "extract_graph.txt").write_text("mine {text}", encoding="utf-8")
    assert load_prompt("extract_graph", "ja", tmp_path) == "mine {text}"


def test_the_english_prompts_ask_for_the_language_of_the_text():
    # what the index writes follows the text; what a query writes follows {language}
    follows_text = {"extract_graph": "same language as the text", "extract_claims": "same language as the text",
                    "summarize_descriptions": "same language as the descriptions",
                    "community_report": "in the language of the data"}
    for name, wording in follows_text.items():
        assert wording in (PACKAGE_DIR / "en" / f"{name}.txt").read_text(encoding="utf-8"), name
    for name in ("query_answer", "query_map", "query_reduce", "lazy_claims", "lazy_subqueries", "drift_primer",
                 "drift_followup"):
        assert "{language}" in (PACKAGE_DIR / "en" / f"{name}.txt").read_text(encoding="utf-8"), name


def test_the_note_is_for_japanese_only():
    assert language_note("ja") == JAPANESE_NOTE
    assert "no Japanese prompts yet" in JAPANESE_NOTE and "\n" not in JAPANESE_NOTE
    assert language_note("en") is None and language_note("zh") is None


# -- what the user sees --------------------------------------------------------------------------

def test_indexing_a_japanese_corpus_warns_and_records_the_note(tmp_path):
    write_docs(tmp_path, {"soseki.txt": " ".join(JAPANESE.values())})
    logged: list[str] = []
    with start_mock_server() as server:
        result = asyncio.run(run_index(settings_for(tmp_path, server), log=logged.append))
    assert [m for m in logged if "Japanese" in m] == [f"warning: {JAPANESE_NOTE}"]
    stats = json.loads((tmp_path / "output" / "stats.json").read_text(encoding="utf-8"))
    assert stats["language"] == "ja" and stats["language_note"] == JAPANESE_NOTE == result.stats["language_note"]
    # the English prompts went to the model
    assert load_prompt("extract_graph", "en").split("{")[0][:60] in json.dumps(list(server.requests), ensure_ascii=False)


def test_an_english_corpus_has_no_note(tmp_path):
    write_docs(tmp_path, {"tokyo.txt": ENGLISH["plain"] * 3})
    logged: list[str] = []
    with start_mock_server() as server:
        result = asyncio.run(run_index(settings_for(tmp_path, server), log=logged.append))
    assert not [m for m in logged if "Japanese" in m] and "language_note" not in result.stats


def test_a_japanese_question_shows_the_note_and_asks_for_japanese(tmp_path):
    write_docs(tmp_path, {"soseki.txt": " ".join(JAPANESE.values())})
    with start_mock_server() as server:
        env = {"SENSEGRAPH_CHAT__PROVIDER": "openai", "SENSEGRAPH_CHAT__BASE_URL": server.base_url,
               "SENSEGRAPH_CHAT__MODEL": "mock", "SENSEGRAPH_CHAT__API_KEY": "x",
               "SENSEGRAPH_EMBEDDING__PROVIDER": "openai", "SENSEGRAPH_EMBEDDING__BASE_URL": server.base_url,
               "SENSEGRAPH_EMBEDDING__MODEL": "mock", "SENSEGRAPH_EMBEDDING__API_KEY": "x",
               "SENSEGRAPH_CHUNKS__SIZE": "120", "SENSEGRAPH_CHUNKS__OVERLAP": "20"}
        asyncio.run(run_index(load_settings(tmp_path, env=env), log=lambda m: None))
        before = len(server.requests)
        res = CliRunner().invoke(cli_main, ["query", "夏目漱石はどんな小説を書きましたか？", "--method", "basic",
                                            "--root", str(tmp_path)], env=env)
        assert f"warning: {JAPANESE_NOTE}" in res.stderr
        assert res.exit_code == 0, res.output
        asked = json.dumps(list(server.requests)[before:], ensure_ascii=False)
        assert "Write in Japanese" in asked


def test_an_english_question_shows_no_note(tmp_path):
    write_docs(tmp_path, {"tokyo.txt": ENGLISH["plain"] * 3})
    with start_mock_server() as server:
        env = {"SENSEGRAPH_CHAT__PROVIDER": "openai", "SENSEGRAPH_CHAT__BASE_URL": server.base_url,
               "SENSEGRAPH_CHAT__MODEL": "mock", "SENSEGRAPH_CHAT__API_KEY": "x",
               "SENSEGRAPH_EMBEDDING__PROVIDER": "openai", "SENSEGRAPH_EMBEDDING__BASE_URL": server.base_url,
               "SENSEGRAPH_EMBEDDING__MODEL": "mock", "SENSEGRAPH_EMBEDDING__API_KEY": "x"}
        asyncio.run(run_index(load_settings(tmp_path, env=env), log=lambda m: None))
        res = CliRunner().invoke(cli_main, ["query", "What is Tokyo?", "--method", "basic", "--root", str(tmp_path)],
                                 env=env)
    assert res.exit_code == 0, res.output
    assert "Japanese" not in res.stderr
