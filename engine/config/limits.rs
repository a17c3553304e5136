//! Bounds on what a model's configuration may say. Each is far above any released model
//! (Llama 3.1 405B: hidden 16384, ffn 53248, 126 layers, 128 heads of 128; vocabularies up to
//! about 256k tokens; contexts up to 10M), and together they keep every size derived from
//! them (a head group's width, a layer's weights, the parameter count) far inside 64 bits: a
//! corrupt number is refused here, by name, before it sizes anything.

/// `hidden_size`
pub const DIM: usize = 1 << 16;
/// `intermediate_size`
pub const FFN_DIM: usize = 1 << 18;
/// `num_hidden_layers`
pub const LAYERS: usize = 1 << 10;
/// `num_attention_heads` (and so `num_key_value_heads`)
pub const HEADS: usize = 1 << 10;
/// `head_dim`
pub const HEAD_DIM: usize = 1 << 10;
/// Query heads times `head_dim`: the attention's width.
pub const ATTENTION_WIDTH: usize = 1 << 16;
/// `vocab_size`
pub const VOCAB: usize = 1 << 22;
/// `max_position_embeddings`: positions are u32 on the GPU, and 16M is past any model.
pub const CONTEXT: usize = 1 << 24;
