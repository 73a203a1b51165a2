"""Residues in one place: one rule for which characters are residues, and the embedders'
feature layout, which the model's substitution channel reads."""

import numpy as np
import pytest

from pfamalign import residues
from pfamalign.pipelines import embed
from pfamalign.pipelines import stockholm as st

NOT_RESIDUES = ["-", ".", "*", "1", " ", "é", "ß"]  # gaps, stop, digit, space, non-ASCII letters


@pytest.mark.parametrize("bad", NOT_RESIDUES)
def test_every_validator_rejects_the_same_characters(tmp_path, bad):
    seq = "MK" + bad + "V"
    assert residues.first_invalid(seq) == 2
    with pytest.raises(ValueError, match="non-protein character .* at position 3 \\(1-based"):
        residues.normalize_sequence(seq)
    with pytest.raises(ValueError, match="invalid residue .* at position 3"):
        embed.get_embedder("builtin").embed([seq])
    if bad not in st.GAP_CHARS + " ":  # an aligned row may hold gaps; a space splits fields
        path = tmp_path / "x.sto"
        path.write_text(f"# STOCKHOLM 1.0\ns1 {seq}\n//\n", encoding="latin-1")
        with pytest.raises(st.StockholmError, match="at column 3"):
            list(st.read_families(path))


def test_all_letters_are_residues_in_either_case():
    letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    assert residues.first_invalid(letters + letters.lower()) is None
    assert residues.first_invalid("AC-D.E~", st.GAP_CHARS) is None
    assert residues.normalize_sequence(letters.lower()) == letters
    (f,) = embed.get_embedder("builtin").embed([letters.lower()])
    assert "".join(residues.AA_ALPHABET[i] for i in f.argmax(1)) == letters.replace("J", "X")


@pytest.mark.parametrize("embedder_id", ["builtin/onehot", "builtin/onehot+blosum62"])
def test_builtin_features_follow_their_layout(embedder_id):
    layout = embed.feature_layout(embedder_id)
    e = embed.get_embedder(embedder_id)
    (f,) = e.embed([layout.alphabet])
    np.testing.assert_array_equal(f[:, layout.onehot], np.eye(len(layout.alphabet)))
    if layout.has_substitution:  # rows times the scale are BLOSUM62 scores (U as C, O as K)
        np.testing.assert_array_equal(layout.substitution_scale * f[:, layout.substitution_rows],
                                      residues.substitution_scores(layout.alphabet, layout.alphabet))


def test_feature_layout_by_embedder_id():
    assert embed.feature_layout("builtin") == embed.feature_layout("builtin/onehot")
    assert not embed.feature_layout("builtin/onehot").has_substitution
    assert embed.feature_layout("builtin/onehot+blosum62").substitution_scale == 4.0
    esm = embed.feature_layout("esm2_t6_8M_UR50D/layer6")  # learned features: no residue columns
    assert esm.onehot is None and not esm.has_substitution
    with pytest.raises(embed.EmbedderError, match="unknown builtin features"):
        embed.feature_layout("builtin/nope")


def test_the_written_out_blosum62_is_biopythons():
    from Bio.Align import substitution_matrices

    from pfamalign.residues import BLOSUM62_ALPHABET, blosum62_table

    matrix, table = substitution_matrices.load("BLOSUM62"), blosum62_table()
    for a in BLOSUM62_ALPHABET:
        for b in BLOSUM62_ALPHABET:
            assert table[ord(a), ord(b)] == int(matrix[a, b]), (a, b)
    assert table[ord("*")].sum() == 0 and table[ord("J")].sum() == 0  # off the alphabet: 0
