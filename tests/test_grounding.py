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


# -- what a strong model answers, and inventions (issue "A good model loses nothing") ---------------

@pytest.mark.parametrize("name,text", [
    ("Georgia", "George went home."), ("Austria", "Austin is in Texas."), ("Nigeria", "The Niger flows."),
    ("Parish", "Paris is a city."), ("Apollo 12", "Apollo 11 landed on the Moon."), ("Adams", "Adam ate."),
    ("Tiny Hill Estates", "Tom saw the dog at the farm."),  # initials "the": a common word, not an acronym
    ("Island Trust", "It is for him."), ("Alpha North Daily", "Bread and milk."), ("Fox Orange Radio", "It is for you."),
])
def test_inventions_are_not_grounded(name, text):
    assert not grounded(name, UnitText.of(text))


@pytest.mark.parametrize("name,text", [
    ("Zurich", "She moved to Zürich in 1990."), ("Zürich", "She moved to Zurich."),
    ("红楼梦", "他读了《紅樓夢》。"), ("紅樓夢", "他读了《红楼梦》。"), ("《红楼梦》", "他读了红楼梦。"),
    ("United States", "He came to the U.S. in 1990."), ("U.S.", "The United States Army"),
    ("Germany", "He moved to Ger-\nmany and stayed."), ("Apollo 11", "Ａｐｏｌｌｏ １１ landed."),
    ("Swedish", "Sweden won."), ("Italy", "The Italian team"), ("China", "Chinese officials"),
    ("NATO", "the North Atlantic Treaty Organization"), ("North Atlantic Treaty Organization", "NATO met."),
    ("Church", "The churches were hit."), ("eBay", "He sold it on eBay."),
])
def test_a_strong_models_names_are_grounded_after_normalisation(name, text):
    assert grounded(name, UnitText.of(text))


def test_names_with_a_capital_anywhere_or_in_a_text_without_capitals_are_not_generic():
    unit = UnitText.of("He sold phones on eBay and bought an iPhone running iOS. The pH was low.")
    assert not any(generic(n, unit) for n in ("eBay", "iPhone", "iOS", "pH"))
    lower = UnitText.of("i met john smith in paris last may. we ate at the ritz.")
    assert not lower.cased and not any(generic(n, lower) for n in ("john smith", "paris", "the ritz"))
    assert generic("fire", UnitText.of("The fire spread to the city. Fire crews came."))


def test_titles_the_text_writes_are_not_clauses():
    unit = UnitText.of("He worked at Yahoo! and won on Jeopardy! before Who Framed Roger Rabbit? came out. "
                       "Prince William, Duke of Cambridge, met the United States Department of Health and Human "
                       "Services.")
    for name in ("Yahoo!", "Jeopardy!", "Who Framed Roger Rabbit?", "Prince William, Duke of Cambridge",
                 "United States Department of Health and Human Services"):
        assert not clause(name, unit), name
    assert clause("just three weeks shy of his 42nd birthday", unit) and clause("he left; she stayed", unit)
    # a title-cased clause the text does not write stays a clause
    assert clause("Prince William, Duke Of The Realm", unit)


def test_chinese_names_long_or_with_particle_characters_are_not_clauses():
    unit = UnitText.of("中华人民共和国国务院与美国国家航空航天局会谈。他读了《中华人民共和国宪法》。")
    for name in ("中华人民共和国国务院", "美国国家航空航天局", "《红楼梦》", "吗啡", "酒吧", "袁了凡"):
        assert not clause(name, unit), name
    assert not clause("中华人民共和国宪法", unit)  # set in 《》 by the text: a title
    assert clause("猴王走了") and clause("那猴在山中，却会行走跳跃") and clause("仙童真个丰姿英伟像貌清奇比寻常俗子不同")


@pytest.mark.parametrize("name,kind", [("May", None), ("March", None), ("3M", None), ("万里", None), ("5k", None),
                                       ("$3M", "number"), ("May 1947", "date"), ("3 May", "date"),
                                       ("十万", "number"), ("１９４７", "date")])
def test_only_unambiguous_values_are_dates_or_amounts(name, kind):
    assert value_type(name) == kind


def test_a_hard_wrapped_line_is_not_a_sentence():
    text = ("Scrooge knew Marley was dead. Of course he did. How could it be otherwise? Scrooge and\n"
            "he were partners for I don't know how many years. Scrooge was his sole executor, and\n"
            "Fezziwig his friend.\n\nSTAVE TWO\nThe Ghost came.")
    unit = UnitText.of(text)
    assert sentences_of("Scrooge", unit) & sentences_of("Fezziwig", unit)  # one sentence over two lines
    assert sentences_of("Marley", unit) == {0}
    assert sentences_of("STAVE TWO", unit) != sentences_of("Ghost", unit)  # a heading is its own line


def test_found_by_the_perfect_extractor_bench():
    # bench/extraction_oracle.py on Re-DocRED: the text reads "... the film A.I.. However"
    assert grounded("A.I", UnitText.of("He directed the film A.I.. However, it failed."))
    unit = UnitText.of("Band Aid sang Do They Know It's Christmas? He won the Knight's Cross of the Iron Cross "
                       "with Oak Leaves and Swords.")
    assert not clause("Do They Know It's Christmas?", unit)
    assert not clause("Knight's Cross of the Iron Cross with Oak Leaves and Swords", unit)
