"""Transformer specs: preset sizes, the `--model` parser and spec files (fast, CPU only)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from paraplan.planner.model import LayerKind
from paraplan.planner.model_parse import load_spec_file, parse_model
from paraplan.planner.model_spec import (
    PRESETS,
    Attention,
    FfnKind,
    Norm,
    TransformerSpec,
)

# Parameter counts from the project's issue (independent of the formulas in model_spec).
ISSUE_PARAM_COUNTS = {
    "gpt2": 124_439_808,
    "llama3-8b": 8_030_261_248,
    "llama3-70b": 70_553_706_496,
    "llama3-405b": 405_853_388_800,
    "mixtral-8x7b": 46_702_792_704,
}


# --- presets ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "expected"), ISSUE_PARAM_COUNTS.items())
def test_preset_parameter_count_matches_the_issue(name, expected):
    assert PRESETS[name].num_params == expected


def test_gpt2_parameter_count_written_out():
    # GPT-2 small (Radford et al. 2019): token + position embeddings, 12 blocks of
    # 12h^2 + 13h (QKV/proj/fc1/fc2 weights and biases, two LayerNorms), a final LayerNorm,
    # and a head tied to the token embedding.
    v, s, h, layers = 50257, 1024, 768, 12
    expected = v * h + s * h + layers * (12 * h * h + 13 * h) + 2 * h
    assert expected == ISSUE_PARAM_COUNTS["gpt2"]
    assert PRESETS["gpt2"].num_params == expected


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_layer_chain_holds_every_parameter(name):
    spec = PRESETS[name]
    # A short sequence keeps the profile cheap; parameters do not depend on it.
    profile = spec.to_profile(seq_len=min(spec.seq, 128))
    assert profile.num_params == spec.num_params
    assert profile.num_blocks == spec.layers
    kinds = [layer.kind for layer in profile.layers]
    assert kinds[0] == LayerKind.EMBEDDING
    assert kinds[-1] == LayerKind.HEAD
    assert kinds[1:-1] == [LayerKind.BLOCK] * spec.layers


def test_moe_preset_puts_expert_parameters_in_the_blocks():
    spec = PRESETS["mixtral-8x7b"]
    profile = spec.to_profile(seq_len=128)
    block = profile.layers[1]
    # Mixtral: 8 SwiGLU experts of 3 * 4096 * 14336 weights each per block (Jiang et al. 2024).
    assert block.expert_params == 8 * 3 * 4096 * 14336
    assert profile.is_moe
    assert (profile.experts, profile.top_k) == (8, 2)


# --- parse_model: presets and family forms -------------------------------------------------


@pytest.mark.parametrize("text", ["gpt2", "GPT2", "  Llama3-8B ", "MIXTRAL-8x7B"])
def test_presets_parse_case_insensitively(text):
    assert parse_model(text) == PRESETS[text.strip().lower()]


def test_gpt_family_form():
    spec = parse_model("gpt:layers=96,hidden=12288,heads=96,vocab=51200,seq=2048")
    assert (spec.layers, spec.hidden, spec.heads, spec.vocab, spec.seq) == (
        96,
        12288,
        96,
        51200,
        2048,
    )
    # GPT defaults: full multi-head attention, a 4h GELU MLP, learned positions, biases,
    # LayerNorm, dropout and the unfused (math) attention of Korthikanti et al. 2022.
    assert spec.kv_heads == 96
    assert spec.ffn == 4 * 12288
    assert spec.ffn_kind == FfnKind.GELU
    assert spec.learned_pos and spec.bias and spec.dropout
    assert spec.norm == Norm.LAYERNORM
    assert spec.attention == Attention.MATH
    assert spec.experts == 0


def test_llama_family_form_describes_llama3_8b():
    # Llama 3 8B by its sizes (Dubey et al. 2024, Table 3) is the preset under another name.
    text = "llama:layers=32,hidden=4096,heads=32,kv_heads=8,ffn=14336,vocab=128256,seq=8192"
    spec = parse_model(text)
    assert spec.ffn_kind == FfnKind.SWIGLU
    assert spec.kv_heads == 8
    assert spec.num_params == ISSUE_PARAM_COUNTS["llama3-8b"]
    assert replace(spec, name="llama3-8b") == PRESETS["llama3-8b"]


def test_moe_family_form_describes_mixtral():
    text = (
        "moe:layers=32,hidden=4096,heads=32,kv_heads=8,ffn=14336,vocab=32000,seq=32768,"
        "experts=8,top_k=2"
    )
    spec = parse_model(text)
    assert (spec.experts, spec.top_k, spec.expert_ffn) == (8, 2, 14336)
    assert spec.num_params == ISSUE_PARAM_COUNTS["mixtral-8x7b"]
    assert replace(spec, name="mixtral-8x7b") == PRESETS["mixtral-8x7b"]


def test_family_form_accepts_spaces_underscores_and_aliases():
    spec = parse_model("llama: n_layers=2 , hidden=1_024, heads=8, kv=2, vocab=1000, tied=yes")
    assert (spec.layers, spec.hidden, spec.kv_heads) == (2, 1024, 2)
    assert spec.tied_embeddings is True


# --- spec files ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["gpt2", "llama3-8b", "mixtral-8x7b"])
def test_spec_file_round_trip(tmp_path, name):
    spec = PRESETS[name]
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(spec.to_dict()))
    assert parse_model(str(path)) == spec
    assert load_spec_file(path) == spec


def test_spec_file_round_trip_of_a_family_form(tmp_path):
    spec = parse_model("moe:layers=4,hidden=256,heads=4,vocab=500,seq=256,experts=4,top_k=2")
    path = tmp_path / "tiny-moe.json"
    path.write_text(json.dumps(spec.to_dict()))
    assert parse_model(str(path)) == spec


def test_spec_file_without_name_takes_the_file_stem(tmp_path):
    path = tmp_path / "my-model.json"
    path.write_text(json.dumps({"layers": 2, "hidden": 64, "heads": 4, "vocab": 100}))
    assert parse_model(str(path)).name == "my-model"


def test_spec_file_rejects_unknown_keys(tmp_path):
    data = PRESETS["gpt2"].to_dict()
    data["dropout_rate"] = 0.1
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="dropout_rate"):
        load_spec_file(path)


def test_spec_file_rejects_invalid_json(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text("{layers: 2")
    with pytest.raises(ValueError, match=r"broken\.json"):
        parse_model(str(path))


# --- parse_model: errors name the bad token --------------------------------------------------


def test_unknown_preset_is_named():
    with pytest.raises(ValueError, match="gpt5"):
        parse_model("gpt5")


def test_unknown_family_is_named():
    with pytest.raises(ValueError, match="unknown family 'bert'"):
        parse_model("bert:layers=12,hidden=768,heads=12,vocab=30522")


def test_token_without_equals_is_named():
    with pytest.raises(ValueError, match="'heads'"):
        parse_model("gpt:layers=2,hidden=64,heads,vocab=100")


def test_unknown_key_is_named_with_the_accepted_keys():
    with pytest.raises(ValueError, match="unknown key 'depth'") as err:
        parse_model("gpt:depth=2,hidden=64,heads=4,vocab=100")
    for key in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "experts", "top_k"):
        assert key in str(err.value)


def test_non_integer_value_is_named():
    with pytest.raises(ValueError, match="layers='two'"):
        parse_model("gpt:layers=two,hidden=64,heads=4,vocab=100")


def test_heads_must_divide_hidden():
    with pytest.raises(ValueError, match=r"hidden=100.*heads=3"):
        parse_model("gpt:layers=2,hidden=100,heads=3,vocab=100")


def test_kv_heads_must_divide_heads():
    with pytest.raises(ValueError, match=r"heads=8.*kv_heads=3"):
        parse_model("llama:layers=2,hidden=64,heads=8,kv_heads=3,vocab=100")


def test_top_k_needs_experts():
    with pytest.raises(ValueError, match="top_k"):
        parse_model("moe:layers=2,hidden=64,heads=4,vocab=100,top_k=2")


def test_top_k_must_not_exceed_experts():
    with pytest.raises(ValueError, match="top_k=3"):
        parse_model("moe:layers=2,hidden=64,heads=4,vocab=100,experts=2,top_k=3")


def test_missing_size_is_named():
    with pytest.raises(ValueError, match="missing vocab"):
        parse_model("gpt:layers=2,hidden=64,heads=4")


def test_missing_file_is_named(tmp_path):
    path = tmp_path / "nowhere.json"
    with pytest.raises(ValueError, match=r"nowhere\.json"):
        parse_model(str(path))


@pytest.mark.parametrize("bad", [{"layers": 0}, {"hidden": -64}, {"kv_heads": -1}])
def test_spec_rejects_non_positive_sizes(bad):
    sizes = {"layers": 2, "hidden": 64, "heads": 4, "vocab": 100, **bad}
    (key,) = bad
    with pytest.raises(ValueError, match=key):
        TransformerSpec(**sizes)


# --- sequence length -------------------------------------------------------------------------


def test_learned_positions_refuse_longer_sequences():
    gpt2 = PRESETS["gpt2"]  # 1024 learned positions
    assert gpt2.to_profile(seq_len=1024).seq_len == 1024
    with pytest.raises(ValueError, match="1024 learned positions"):
        gpt2.to_profile(seq_len=2048)


def test_learned_positions_of_a_family_form():
    spec = parse_model("gpt:layers=2,hidden=64,heads=4,vocab=100,seq=256")
    with pytest.raises(ValueError, match="seq_len=512"):
        spec.to_profile(seq_len=512)


def test_rotary_models_take_longer_sequences():
    # Llama uses rotary positions: no table to outgrow.
    spec = parse_model("llama:layers=2,hidden=64,heads=4,vocab=100,seq=256")
    assert spec.to_profile(seq_len=1024).seq_len == 1024


def test_profile_defaults_to_the_spec_context_and_rejects_zero():
    spec = parse_model("gpt:layers=2,hidden=64,heads=4,vocab=100,seq=256")
    assert spec.to_profile().seq_len == 256
    with pytest.raises(ValueError, match="seq_len=0"):
        spec.to_profile(seq_len=0)
