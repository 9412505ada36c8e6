"""The checks of extracted names against their text unit (index/grounding.py)."""
import pytest

from sensegraph.index.grounding import UnitText, clause, generic, grounded, sentences_of, value_type

TEXT = ("Harbor Logistics, based in Rotterdam, said on Monday that the fire spread to the city. The Swedish "
        "churches were hit. The Board met at ELAM. Fire crews from the United Nations arrived. Mr. Scrooge's "
        "nephew joined the Bank of America.")


@pytest.mark.parametrize("name", ["harbor logistics", "Sweden", "churches", "Church", "UN", "BA", "ELAM",
                                  "Ebenezer Scrooge", "President Scrooge", "Scrooge's nephew", "Bank of America"])
def test_grounded_names(name):
    assert grounded(name, UnitText.of(TEXT))


@pytest.mark.parametrize("name", ["John Smith", "Rome", "Stockholm Logistics Group Holding", "NATO", "Berlin"])
def test_invented_names(name):
    assert not grounded(name, UnitText.of(TEXT))


def test_common_nouns_are_generic_and_names_the_text_capitalises_are_not():
    unit = UnitText.of(TEXT)
    assert generic("fire", unit) and generic("Fire", unit) and generic("city", unit)  # "Fire crews" opens a sentence
    assert not generic("Board", unit) and not generic("Rotterdam", unit) and not generic("Monday", unit)
    assert not generic("ELAM", unit) and not generic("1947", unit)
    # a name that only ever opens sentences, capitalised by the model, is not judged a common noun
    assert not generic("Apple", UnitText.of("Apple sold phones. Apple grew."))


def test_clauses():
    assert clause("just three weeks shy of his 42nd birthday")
    assert clause("he left; she stayed") and clause("那猴在山中，却会行走跳跃") and clause("猴王走了")
    assert clause("东胜神洲傲来国花果山水帘洞")  # longer than a name gets
    assert not clause("University of California, Berkeley") and not clause("灵台方寸山") and not clause("Paris, Texas")


@pytest.mark.parametrize("name,kind", [("1947", "date"), ("March 3, 1947", "date"), ("the 1990s", "date"),
                                       ("19th century", "date"), ("1947年", "date"), ("2004-05", "date"),
                                       ("1 million", "number"), ("42%", "number"), ("$5 billion", "number"),
                                       ("Rotterdam", None), ("Apollo 11", None), ("May Day", None)])
def test_value_types(name, kind):
    assert value_type(name) == kind


def test_sentences_of_a_name():
    unit = UnitText.of(TEXT)
    assert sentences_of("Harbor Logistics", unit) == {0}
    assert sentences_of("United Nations", unit) == {3}
    assert sentences_of("Scrooge", unit) == {4}
    zh = UnitText.of("海中有一座名山，唤为花果山。山上有一石猴。石猴在花果山。")
    assert sentences_of("花果山", zh) == {0, 2} and sentences_of("石猴", zh) == {1, 2}


def test_a_part_of_a_name_grounds_it_only_when_the_text_writes_it_as_a_name():
    # Operation Dulce, embedded 1.5B: "United States Air Force" is not in the text; "states" and
    # "force" are, as common words.
    unit = UnitText.of("Mercer states the facts. They force the door. Later, Scrooge left.")
    assert not grounded("United States Air Force", unit)
    assert grounded("Ebenezer Scrooge", unit)


def test_a_lower_case_name_is_a_name_only_if_the_text_capitalises_the_phrase():
    unit = UnitText.of("The Paranormal Military Squad met. There was paranormal activity. We saw Paranormal Activity twice.")
    assert not generic("Paranormal Military Squad", unit)
    assert not generic("paranormal activity", unit)  # the film's title, capitalised as a phrase
    other = UnitText.of("The Paranormal Military Squad met. There was paranormal activity.")
    assert generic("paranormal activity", other)
