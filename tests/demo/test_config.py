"""The build config: one declaration of the network's shape, and the shipped demo's numbers."""

from dataclasses import asdict, fields

from aieng.demo.build import DemoBuildConfig
from aieng.demo.model import ModelDims, llama_config

#: The shipped demo model. Changing any of these changes the model every cache, store and
#: notebook holds: bump RECIPE_VERSION with it.
SHIPPED_DIMS = dict(
    hidden_size=128,
    intermediate_size=384,
    num_layers=3,
    num_heads=4,
    num_kv_heads=4,
    context_length=512,
    rope_theta=10000.0,
    initializer_range=0.08,
    tie_word_embeddings=True,
)
SHIPPED_TRAINING = dict(
    seed=0,
    steps=3000,
    batch_size=32,
    lr=3e-3,
    warmup_steps=50,
    min_lr_ratio=0.05,
    weight_decay=0.05,
    grad_clip=1.0,
    vocab_size=1024,
    tokenizer_examples=20000,
    mix=None,
)


def test_model_dims_defaults_are_the_shipped_demo():
    assert asdict(ModelDims()) == SHIPPED_DIMS


def test_build_config_defaults_are_the_shipped_demo():
    config = DemoBuildConfig()
    assert config.dims == ModelDims()
    assert {k: v for k, v in asdict(config).items() if k != "dims"} == SHIPPED_TRAINING


def test_the_shape_is_declared_once():
    shape = {f.name for f in fields(ModelDims)}
    assert not shape & {f.name for f in fields(DemoBuildConfig)}


def test_tiny_keeps_its_small_shape_and_takes_overrides():
    tiny = DemoBuildConfig.tiny(steps=3, seed=2)
    assert (tiny.steps, tiny.seed) == (3, 2)
    assert tiny.dims == ModelDims(hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2, num_kv_heads=1)
    assert tiny.dims.initializer_range == 0.08 and tiny.dims.context_length == 512


def test_each_config_gets_its_own_dims():
    a, b = DemoBuildConfig(), DemoBuildConfig()
    assert a.dims == b.dims
    a.dims = ModelDims(hidden_size=64)
    assert b.dims.hidden_size == 128


def test_the_llama_config_carries_every_dimension():
    config = llama_config(ModelDims(), vocab_size=600, bos_id=1, eos_id=2, pad_id=0)
    assert (config.hidden_size, config.intermediate_size, config.num_hidden_layers) == (128, 384, 3)
    assert (config.num_attention_heads, config.num_key_value_heads) == (4, 4)
    assert config.max_position_embeddings == 512 and config.initializer_range == 0.08
    assert config.tie_word_embeddings is True
    assert config.rope_parameters["rope_theta"] == 10000.0
