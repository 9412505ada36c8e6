"""report_checks.py against realistic contexts: numbers checked by value (stated or derived by a
stated rule), the report's summary checked too, and a strong model's correct report kept whole."""
from __future__ import annotations

import pandas as pd
import pytest
from test_community_reports import answering, run

from sensegraph.index import report_checks

# A community as a strong model sees it: figures that a report may restate, or derive from.
ENTITIES = [
    ("NORTHWIND TRADERS", "organization",
     "Northwind Traders is a shipping company founded in 1985 in Rotterdam by Anna de Vries. Its fleet grew "
     "from 200 ships in 2010 to 300 ships in 2020, and it employs 4,200 people."),
    ("ANNA DE VRIES", "person",
     "Anna de Vries, born in 1951, founded Northwind Traders in 1985 and led it until 2012. In 1995 she "
     "opened its first office abroad."),
    ("PORT OF ROTTERDAM", "location",
     "The Port of Rotterdam handles 3.5 million containers a year; 25% of them are carried by Northwind Traders."),
    ("HARBOUR ACT", "law", "The Harbour Act of 1897 opened the Port of Rotterdam to private shipping companies."),
    ("MAERSK LINE", "organization",
     "Maersk Line is a rival carrier with 100 ships at the port, whose share of the port's traffic fell from "
     "40% in 2015 to 30% in 2020."),
]
RELATIONSHIPS = [
    ("ANNA DE VRIES", "NORTHWIND TRADERS", "Anna de Vries founded Northwind Traders in 1985 and ran it for decades."),
    ("NORTHWIND TRADERS", "PORT OF ROTTERDAM",
     "Northwind Traders operates from the Port of Rotterdam, where its revenue rose from 10 million euros in "
     "2015 to 15 million euros in 2019."),
    ("PORT OF ROTTERDAM", "HARBOUR ACT", "The Harbour Act governs the Port of Rotterdam."),
    ("MAERSK LINE", "PORT OF ROTTERDAM", "Maersk Line competes with Northwind Traders at the Port of Rotterdam."),
]


def northwind(weak: list[tuple[str, str]] = ()):
    """The tables of one community holding ENTITIES and RELATIONSHIPS (plus `weak` co-occurrence
    edges) and a ten-year contract claim."""
    titles = [t for t, _, _ in ENTITIES]
    entities = pd.DataFrame({
        "id": [f"e{i}" for i in range(len(titles))], "human_readable_id": range(len(titles)), "title": titles,
        "type": [k for _, k, _ in ENTITIES], "description": [d for _, _, d in ENTITIES],
        "text_unit_ids": [["tu"]] * len(titles), "frequency": 1, "degree": [4, 2, 3, 1, 1]})
    rows = [(s, t, d, False) for s, t, d in RELATIONSHIPS]
    rows += [(s, t, f"{s} and {t} are mentioned in the same sentence (no relationship was extracted).", True)
             for s, t in weak]
    relationships = pd.DataFrame({
        "id": [f"r{i}" for i in range(len(rows))], "human_readable_id": range(len(rows)),
        "source": [r[0] for r in rows], "target": [r[1] for r in rows], "description": [r[2] for r in rows],
        "weight": [0.5 if r[3] else 1.0 for r in rows],
        "combined_degree": [6, 7, 4, 4][:len(rows)] + [2] * (len(rows) - 4),
        "text_unit_ids": [["tu"]] * len(rows), "co_occurrence": [r[3] for r in rows]})
    covariates = pd.DataFrame({
        "id": ["k0"], "human_readable_id": [1], "covariate_type": "claim", "type": ["CONTRACT"],
        "description": ["Northwind Traders signed a ten-year berth contract with the Port of Rotterdam."],
        "subject_id": ["NORTHWIND TRADERS"], "object_id": ["PORT OF ROTTERDAM"], "status": ["TRUE"],
        "start_date": ["2015-06-01"], "end_date": ["2025-06-01"], "source_text": "", "text_unit_id": "tu"})
    comms = pd.DataFrame([{
        "id": "c0", "human_readable_id": 0, "community": 0, "level": 0, "parent": -1, "children": [],
        "title": "Community 0", "entity_ids": list(entities["id"]), "relationship_ids": list(relationships["id"]),
        "text_unit_ids": ["tu"], "period": "2024-01-01", "size": len(titles), "carried": False}])
    return entities, relationships, covariates, comms


# What a strong model writes from that context: every figure is stated there or derived from it.
STRONG = {
    "title": "Northwind Traders and the Port of Rotterdam",
    "summary": "Northwind Traders, a Rotterdam shipping company founded in 1985 by Anna de Vries, grew its fleet "
               "by 50% between 2010 and 2020 [Data: Entities (0, 1)]. Its business rests on the Port of Rotterdam, "
               "which handles some 3.5 million containers a year, and on a 19th-century law that opened the port "
               "to private shippers [Data: Entities (2, 3); Relationships (1, 2)].",
    "rating": 6.0,
    "rating_explanation": "A mid-sized shipping group with a clear role in one port.",
    "findings": [
        {"summary": "A 50% larger fleet in a decade",
         "explanation": "Northwind's fleet grew from 200 to 300 ships between 2010 and 2020, a 50% increase "
                        "[Data: Entities (0)]."},
        {"summary": "Led by its founder for nearly 30 years",
         "explanation": "Anna de Vries founded the company in 1985, aged 34 years, and led it for over 25 years, "
                        "until 2012; her first office abroad opened in the 1990s [Data: Entities (1); "
                        "Relationships (0)]."},
        {"summary": "Revenue at the port rose by half",
         "explanation": "Revenue at the Port of Rotterdam rose from 10 to 15 million euros between 2015 and 2019, "
                        "a 50% rise in 4 years; the 2015 figure was 67% of the 2019 one [Data: Relationships (1)]."},
        {"summary": "A quarter of the port's containers",
         "explanation": "Roughly 1 in 4 of the port's 3-4 million containers a year travel on Northwind ships "
                        "[Data: Entities (2)]."},
        {"summary": "A 19th-century legal foundation",
         "explanation": "The port was opened to private shipping by the Harbour Act, a law of the 19th century, "
                        "long before Northwind's fleet reached 300 ships [Data: Entities (3); Relationships (2)]."},
        {"summary": "A ten-year berth contract",
         "explanation": "In June 2015 Northwind signed a 10-year berth contract with the port that runs until "
                        "June 2025 [Data: Claims (1)]."},
        {"summary": "A rival losing ground",
         "explanation": "Maersk Line's share of the port's traffic fell by 10 percentage points, from 40% to 30%, "
                        "between 2015 and 2020, a 25% decline [Data: Entities (4); Relationships (3)]."},
        {"summary": "Growth through the 2010s",
         "explanation": "Most of the fleet's growth and the port contract date from the 2010s, while the company "
                        "was founded in the 20th century [Data: Entities (0); Claims (1)]."},
        {"summary": "A large employer",
         "explanation": "Northwind employs over 4,000 people, some 4.2 thousand by its own count "
                        "[Data: Entities (0)]."},
    ],
}


def context_of(reporter) -> str:
    return reporter.prompts[0].split("Data:\n\n", 1)[1].removesuffix("\n")


@pytest.fixture(scope="module")
def written():
    """STRONG through write_reports: (the stored report, the context it was checked against, counts)."""
    entities, relationships, covariates, comms = northwind()
    reporter = answering(STRONG)
    counts: dict[str, int] = {}
    reports, failed = run(comms, entities, relationships, reporter, budget=4000, covariates=covariates, counts=counts)
    assert failed == [] and len(reports) == 1
    return reports.iloc[0], context_of(reporter), counts


@pytest.fixture(scope="module")
def ctx(written):
    return report_checks.read_context(written[1])


def test_a_strong_models_correct_report_passes_unchanged(written):
    row, context, counts = written
    assert "-----Claims-----" in context and "2015-06-01 - 2025-06-01" in context
    assert row["title"] == STRONG["title"] and row["summary"] == STRONG["summary"]
    assert list(row["findings"]) == STRONG["findings"]
    assert row["rank"] == 6.0 and row["rating_explanation"] == STRONG["rating_explanation"]
    assert counts == {**report_checks.new_counts(), "reports_checked": 1, "findings_written": 9, "findings_kept": 9}


@pytest.mark.parametrize("text", [
    "The fleet grew by 50% [Data: Entities (0)].",                    # 200 -> 300 ships
    "Revenue rose 50% from 2015 to 2019.",                            # 10 -> 15 million euros
    "In 2015 revenue was 67% of its 2019 level.",                     # a share, rounded: 10 / 15
    "Maersk Line's share fell by a quarter, a 25% decline.",           # 40% -> 30%
    "Maersk Line lost 10 percentage points.",                         # 40% - 30%
    "Anna de Vries led the company for over 20 years.",               # 1985 .. 2010/2012
    "She ran it for nearly 30 years and founded it aged 34 years.",   # 2012 - 1985 = 27; 1985 - 1951
    "A 34-year-old founder.",
    "The contract runs for 10 years.",                                # ten-year, and 2025 - 2015
    "Revenue rose in 4 years.",                                       # 2019 - 2015
    "The Harbour Act is a 19th-century law.",                         # 1897
    "The Harbour Act dates from the 19th century.",
    "She is a 20th-century founder.",                                 # 1951, 1985, 1995
    "Its office abroad opened in the 1990s.",                         # 1995
    "The office opened between 1990 and 2000.",                       # a decade's bounds around 1995
    "The port handles 3-4 million containers.",                       # 3.5 million
    "The port handles between 3 and 4 million containers.",
    "Revenue rose from 10 to 15 million euros.",                      # the scale of both ends
    "About 1 in 4 containers is Northwind's.",                        # 25%
    "Northwind carries 1 out of 4 containers.",
    "The port handles 3,500,000 containers, or 3.5 million.",         # one value however written
    "Northwind employs over 4,000 people.",                           # 4,200
    "Northwind employs about 4,000 people.",
    "Northwind employs about 4.2 thousand people.",
    "The community has 5 entities and 4 relationships.",              # row counts, with the kind named
    "The port handles 3.5 million containers a year; 25% of them are Northwind's.",
    "The contract ends 40 years after Northwind's founding.",          # its description and its claim
])
def test_numbers_stated_or_derived_by_a_rule_are_supported(ctx, text):
    assert report_checks.unsupported(text, ctx) == []


@pytest.mark.parametrize("text, unsupported", [
    ("About 1 in 100 containers is Northwind's.", ["1 in 100"]),      # 1 and 100 occur, the ratio does not
    ("Northwind owns 5 ports.", ["5"]),                               # 5 entities is no 5 ports; nor "3.5"
    ("Northwind owns 15 ships.", ["15"]),                             # 15 million euros is no 15
    ("Northwind has 6 offices.", ["6"]),                              # June (2015-06-01) is no 6
    ("The fleet grew by 45%.", ["45%"]),
    ("The fleet grew by 51%.", ["51%"]),                              # 50% rounds to 50, not 51
    ("Anna de Vries led the company for over 150 years.", ["150"]),
    ("The Harbour Act is a 17th-century law.", ["17th"]),
    ("The office opened in the 1970s.", ["1970s"]),
    ("The office opened between 1960 and 1970.", ["1960 and 1970"]),
    ("The port handles 5-6 million containers.", ["5-6 million"]),
    ("The port handles 7 million containers.", ["7 million"]),
    ("Northwind employs over 5,000 people.", ["5,000"]),              # 4,200 is not over 5,000
    ("The community has 7 entities.", ["7"]),
    ("The company employs 10,000 staff.", ["10,000"]),
    # 1897 and 2025 are years of the context, but no row names both the Harbour Act and the contract
    ("The Harbour Act came over 120 years before the contract ends.", ["120"]),
])
def test_numbers_the_context_does_not_support_are_reported(ctx, text, unsupported):
    assert report_checks.unsupported(text, ctx) == unsupported


# Other forms the module docstring names, each against a context line that states what it needs.
@pytest.mark.parametrize("context, text, unsupported", [
    ("The fund holds 1,487,000 shares.", "The fund holds 1.5 million shares.", []),   # at the precision written
    ("The fund holds 1,487,000 shares.", "The fund holds 1.4 million shares.", ["1.4 million"]),
    ("The deal was worth 2 billion dollars.", "The deal was worth $2bn.", []),
    ("Sales rose from 10% to 15%.", "Sales grew 10-15% a year.", []),                # the first end takes the %
    ("Sales rose from 10 to 30 units.", "Sales rose threefold, a 3-fold rise.", []),  # 30 / 10
    ("Sales rose from 10 to 30 units.", "Sales rose 5-fold.", ["5"]),
    ("She was born in 1951 and founded the firm in 1985.", "She founded it aged 34.", []),
    ("She was born in 1951 and founded the firm in 1985.", "She founded it aged 40.", ["40"]),
    ("The firm was founded in 1985 and sold in 2015.", "It was independent for 3 decades.", []),
    ("The firm was founded in 1985 and sold in 2015.", "It was independent for 5 decades.", ["5"]),
    ("The firm was founded in 1843 and sold in 1850.", "It dates from the 1800s.", []),  # that century
    ("Three of the five founders were engineers.", "3 out of 5 founders were engineers.", []),
    ("One in four visitors came by train.", "Nearly 1 in 4 visitors came by train.", []),
    ("A quarter of the visitors came by train.", "1 in 4 visitors came by train.", []),
    ("A quarter of the visitors came by train.", "1 in 3 visitors came by train.", ["1 in 3"]),
    ("The firm was founded in 1947.", "It was founded around 1950.", []),
    ("The firm was founded in 1947.", "It was founded around 1960.", ["1960"]),
    ("The firm was founded in 1947.", "It was founded in 1950.", ["1950"]),
    ("The report was published on December 19, 1843.", "It was published on 19 December 1843.", []),
    ("The report was published on December 19, 1843.", "It was published on 20 December 1843.", ["20 December"]),
    ("The contract runs 2015-06-01 - 2025-06-01.", "It started on 2015-06-01.", []),
    ("The contract runs 2015-06-01 - 2025-06-01.", "It started on 2015-07-01.", ["2015-07-01"]),
    ("The firm employs 120 people.", "The firm employs approx. 120 people in 2 offices.", ["2"]),
    ("Revenue grew from 200 to 300 euros in 2019.", "Revenue grew 50% in the year to 2019.", []),
])
def test_other_forms(context, text, unsupported):
    header = "-----Entities-----\nid,entity,type,description,degree"
    ctx = report_checks.read_context(f'{header}\n0,X,thing,"{context}",1')
    assert report_checks.unsupported(text, ctx) == unsupported


CHINESE = """-----Entities-----
id,entity,type,description,degree
0,北风贸易,组织,北风贸易成立于1985年，船队从200艘增加到300艘，员工3万人，三分之一在鹿特丹。创始人当年34岁。,2
1,鹿特丹港,地点,鹿特丹港根据一八九七年的法令对私营公司开放，每年处理350万个集装箱。,1

-----Relationships-----
id,source,target,description,combined_degree
0,北风贸易,鹿特丹港,北风贸易自1985年起在鹿特丹港经营，2012年签订新合同，营收达到1.5亿欧元。,3"""


@pytest.mark.parametrize("text, unsupported", [
    ("北风贸易的船队增长了50%。", []),
    ("北风贸易在鹿特丹港经营了20多年。", []),        # 1985 .. 2012
    ("北风贸易经营了近30年。", []),
    ("该法令是19世纪的法令。", []),                   # 一八九七
    ("鹿特丹港每年处理300万至400万个集装箱。", []),   # 350万
    ("营收为150,000,000欧元。", []),                  # 1.5亿
    ("员工超过3万人。", []),
    ("约33%的员工在鹿特丹。", []),                       # 三分之一
    ("创始人当年34岁，1951年出生。", ["1951"]),         # 34 is stated; 1951 is not
    ("合同于6月1日签订。", ["6月1日"]),
    ("该社区有2个实体和1条关系。", []),
    ("该社区有3个实体。", ["3"]),
    ("北风贸易的营收达到150,000,000欧元，约为1.5亿。", []),
    ("2012年签订的合同。", []),
    ("北风贸易经营了50多年。", ["50"]),
    ("员工有5万人。", ["5万"]),
    ("该法令是17世纪的法令。", ["17"]),
])
def test_chinese_numbers_stated_or_derived(text, unsupported):
    assert report_checks.unsupported(text, report_checks.read_context(CHINESE)) == unsupported


# -- the report's summary -----------------------------------------------------------------------

def test_an_unsupported_summary_sentence_is_removed_and_counted(written):
    _, context, _ = written
    counts = report_checks.new_counts()
    summary = ("Northwind Traders is a Rotterdam shipping company [Data: Entities (0)]. The company employs "
               "10,000 staff across 12 countries [Data: Entities (0)]. Its fleet grew by 50% in the 2010s, to "
               "300 ships [Data: Entities (0)].")
    checked = report_checks.check_report(summary, 5.0, [], context, entities=5, relationships=4, counts=counts)
    assert checked.summary == ("Northwind Traders is a Rotterdam shipping company [Data: Entities (0)]. Its fleet "
                               "grew by 50% in the 2010s, to 300 ships [Data: Entities (0)].")
    assert counts["summary_sentences_unsupported"] == 1


def test_a_summary_whose_every_sentence_is_unsupported_is_kept_and_counted(written):
    _, context, _ = written
    counts = report_checks.new_counts()
    summary = "Northwind employs 10,000 staff. It was founded in 1971."
    checked = report_checks.check_report(summary, 5.0, [], context, entities=5, relationships=4, counts=counts)
    assert checked.summary == summary
    assert counts["summary_sentences_unsupported"] == 2


def test_summary_sentences_split_at_sentence_ends_only(written):
    _, context, _ = written
    counts = report_checks.new_counts()
    summary = ("Dr. Anna de Vries founded the company in 1985 (U.S. and Dutch press agree); the port handles "
               "3.5 million containers. Northwind owns 15 ships. 它雇用了4,200人。它有9个港口。")
    checked = report_checks.check_report(summary, 5.0, [], context, entities=5, relationships=4, counts=counts)
    assert checked.summary == ("Dr. Anna de Vries founded the company in 1985 (U.S. and Dutch press agree); the port "
                               "handles 3.5 million containers. 它雇用了4,200人。")
    assert counts["summary_sentences_unsupported"] == 2


def test_a_citation_after_the_full_stop_goes_with_its_sentence(written):
    _, context, _ = written
    counts = report_checks.new_counts()
    summary = "Northwind owns 15 ships. [Data: Entities (0)] It employs 4,200 people. [Data: Entities (0)]"
    checked = report_checks.check_report(summary, 5.0, [], context, entities=5, relationships=4, counts=counts)
    assert checked.summary == "It employs 4,200 people. [Data: Entities (0)]"


# -- the rating ---------------------------------------------------------------------------------

def capped_report(language: str, weak: list[tuple[str, str]] = (), rating: float = 9.0):
    entities, relationships, covariates, comms = northwind(weak)
    keep = {"NORTHWIND TRADERS", "ANNA DE VRIES", "PORT OF ROTTERDAM"}
    members = entities[entities["title"].isin(keep)]
    inside = relationships[relationships["source"].isin(keep) & relationships["target"].isin(keep)]
    comms = comms.assign(entity_ids=[list(members["id"])], relationship_ids=[list(inside["id"])], size=3)
    answer = {**STRONG, "rating": rating, "findings": STRONG["findings"][:1],
              "rating_explanation": "Rated 9 because it is central to everything in the collection."}
    counts: dict[str, int] = {}
    reports, _ = run(comms, members, inside, answering(answer), budget=4000, language=language, counts=counts)
    return reports.iloc[0], counts


def test_a_capped_rating_explains_the_cap_in_english():
    row, counts = capped_report("en")
    # 3 entities and 2 relationships: size 3, capped at 5
    assert row["rank"] == 5.0 and counts["ratings_capped"] == 1
    assert row["rating_explanation"] == ("Rated 5 (the model gave 9): the community has 3 entities and "
                                         "2 relationships, too few to be central to the collection.")


def test_a_capped_rating_explains_the_cap_in_chinese():
    row, _ = capped_report("zh")
    assert row["rank"] == 5.0
    assert row["rating_explanation"] == "评分为5（模型给出9）：该社区只有3个实体和2条关系，规模太小，不足以成为整个数据集的核心。"


def test_a_rating_within_the_cap_keeps_its_explanation():
    row, counts = capped_report("en", rating=4.5)
    assert row["rank"] == 4.5 and counts["ratings_capped"] == 0
    assert row["rating_explanation"] == "Rated 9 because it is central to everything in the collection."


def test_weak_co_occurrence_edges_do_not_raise_the_cap():
    # between the three entities one extracted relationship and one weak edge: counted as two
    # relationships the size would be 3 (cap 5); only the extracted one counts: size 2, cap 3
    entities, relationships, covariates, comms = northwind(
        weak=[("ANNA DE VRIES", "PORT OF ROTTERDAM"), ("MAERSK LINE", "HARBOUR ACT")])
    keep = {"NORTHWIND TRADERS", "ANNA DE VRIES", "PORT OF ROTTERDAM"}
    members = entities[entities["title"].isin(keep)]
    inside = relationships[relationships["source"].isin(keep) & relationships["target"].isin(keep)
                           & (relationships["co_occurrence"] | (relationships["source"] == "ANNA DE VRIES"))]
    assert len(inside) == 2 and inside["co_occurrence"].sum() == 1
    comms = comms.assign(entity_ids=[list(members["id"])], relationship_ids=[list(inside["id"])], size=3)
    answer = {**STRONG, "rating": 5.0, "findings": STRONG["findings"][:1]}
    counts: dict[str, int] = {}
    reports, _ = run(comms, members, inside, answering(answer), budget=4000, counts=counts)
    row = reports.iloc[0]
    assert row["rank"] == 3.0 and counts["ratings_capped"] == 1
    assert "3 entities and 1 relationship," in row["rating_explanation"]
