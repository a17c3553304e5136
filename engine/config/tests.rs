//! Configuration resolution: each architecture's fields, and bad values refused by name.

use super::*;

fn parse(json: &str) -> Result<Config> {
    Config::resolve(&serde_json::from_str(json).unwrap())
}

const SMOLLM2: &str = r#"{
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
    "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152,
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 100000.0,
    "tie_word_embeddings": true, "bos_token_id": 1, "eos_token_id": 2
}"#;

#[test]
fn derives_head_dim_kv_dim_and_group() {
    let c = parse(SMOLLM2).unwrap();
    assert_eq!(c.arch, Arch::Llama);
    assert_eq!(
        (c.head_dim, c.q_dim(), c.kv_dim(), c.group_size()),
        (64, 576, 192, 3)
    );
    assert!(c.tie_embeddings && !c.qkv_bias);
    assert_eq!(c.eos_tokens, vec![2]);
    assert_eq!(c.rope_scaling, RopeScaling::None);
    assert!((c.rms_eps - 1e-5).abs() < 1e-12);
}

#[test]
fn explicit_head_dim_wins() {
    let c = parse(&SMOLLM2.replace("\"vocab_size\"", "\"head_dim\": 128, \"vocab_size\"")).unwrap();
    assert_eq!((c.head_dim, c.q_dim(), c.kv_dim()), (128, 1152, 384));
}

#[test]
fn qwen2_has_qkv_bias_and_mistral_attends_over_its_window() {
    let q = parse(&SMOLLM2.replace("LlamaForCausalLM", "Qwen2ForCausalLM")).unwrap();
    assert!(q.qkv_bias);
    let m = parse(
        &SMOLLM2
            .replace("LlamaForCausalLM", "MistralForCausalLM")
            .replace("\"vocab_size\"", "\"sliding_window\": 4096, \"vocab_size\""),
    )
    .unwrap();
    // SmolLM2's context is 8192: the window is attention's, every layer's, with the global
    // RoPE; not a cap on the context.
    assert_eq!((m.arch, m.max_seq_len), (Arch::Mistral, 8192));
    let s = m.sliding.as_ref().expect("a sliding window");
    assert_eq!((s.window, s.rope_theta), (4096, None));
    assert!(s.local.iter().all(|&l| l) && s.local.len() == m.n_layers);
    assert_eq!(
        (m.window(0), m.window(m.n_layers - 1)),
        (Some(4096), Some(4096))
    );
    // A window as wide as the context is none; Qwen2's, turned on, caps the context.
    let wide = parse(
        &SMOLLM2
            .replace("LlamaForCausalLM", "MistralForCausalLM")
            .replace("\"vocab_size\"", "\"sliding_window\": 8192, \"vocab_size\""),
    )
    .unwrap();
    assert_eq!(wide.sliding, None);
    let q = parse(
        &SMOLLM2
            .replace("LlamaForCausalLM", "Qwen2ForCausalLM")
            .replace("\"vocab_size\"", "\"sliding_window\": 4096, \"vocab_size\""),
    )
    .unwrap();
    assert_eq!((q.max_seq_len, q.sliding), (4096, None));
}

#[test]
fn qwen3_norms_its_heads_and_takes_head_dim_as_given() {
    // Qwen3-0.6B's widths: 16 heads of 128 over a residual of 1024.
    let q = parse(
        &SMOLLM2
            .replace("LlamaForCausalLM", "Qwen3ForCausalLM")
            .replace("\"vocab_size\"", "\"head_dim\": 128, \"vocab_size\"")
            .replace("\"num_attention_heads\": 9", "\"num_attention_heads\": 16")
            .replace("\"num_key_value_heads\": 3", "\"num_key_value_heads\": 8")
            .replace("576", "1024"),
    )
    .unwrap();
    assert_eq!(q.arch, Arch::Qwen3);
    assert!(q.qk_norm && !q.qkv_bias);
    assert_eq!((q.head_dim, q.q_dim(), q.kv_dim()), (128, 2048, 1024));
    assert!(!parse(SMOLLM2).unwrap().qk_norm);
}

#[test]
fn phi3_partial_rotary_and_longrope() {
    // Phi-4-mini's heads: 96 of 128 dimensions turn, so each factor list has 48.
    let list = |v: f64| format!("{:?}", vec![v; 48]);
    let json = SMOLLM2
        .replace("LlamaForCausalLM", "Phi3ForCausalLM")
        .replace("\"vocab_size\"", "\"head_dim\": 128, \"vocab_size\"")
        .replace(
            "\"max_position_embeddings\": 8192",
            "\"max_position_embeddings\": 131072",
        )
        .replace(
            "\"tie_word_embeddings\"",
            &format!(
                r#""partial_rotary_factor": 0.75, "original_max_position_embeddings": 4096,
                   "rope_scaling": {{"type": "longrope", "short_factor": {},
                                    "long_factor": {}}}, "tie_word_embeddings""#,
                list(1.0),
                list(3.0)
            ),
        );
    let c = parse(&json).unwrap();
    assert_eq!((c.arch, c.head_dim, c.rotary_dim), (Arch::Phi3, 128, 96));
    let RopeScaling::LongRope {
        short,
        long,
        original_max_position,
        attention_factor,
    } = &c.rope_scaling
    else {
        panic!("{:?}", c.rope_scaling)
    };
    assert_eq!(
        (short.len(), long[0], *original_max_position),
        (48, 3.0, 4096)
    );
    // transformers' default: sqrt(1 + ln(131072 / 4096) / ln(4096)).
    let want = (1.0 + 32f64.ln() / 4096f64.ln()).sqrt();
    assert!((attention_factor - want).abs() < 1e-12);
    // A list that does not cover the turning pairs is named.
    let short_list = json.replacen(&list(1.0), &format!("{:?}", vec![1.0; 64]), 1);
    let err = parse(&short_list).unwrap_err().to_string();
    assert!(
        err.contains("`short_factor` has 64 factors") && err.contains("48"),
        "{err}"
    );
}

#[test]
fn mixtures_of_experts() {
    let mixtral = parse(
        &SMOLLM2
            .replace("LlamaForCausalLM", "MixtralForCausalLM")
            .replace(
                "\"vocab_size\"",
                "\"num_local_experts\": 8, \"num_experts_per_tok\": 2, \"vocab_size\"",
            ),
    )
    .unwrap();
    let want = Moe {
        n_experts: 8,
        top_k: 2,
        expert_ffn_dim: 1536,
        renormalize: true,
    };
    assert_eq!(mixtral.moe, Some(want));
    // Qwen3-30B-A3B's router: 128 experts of 768, 8 a token, renormalized.
    let qwen = SMOLLM2
        .replace("LlamaForCausalLM", "Qwen3MoeForCausalLM")
        .replace(
            "\"vocab_size\"",
            r#""num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
           "norm_topk_prob": true, "decoder_sparse_step": 1, "mlp_only_layers": [],
           "vocab_size""#,
        );
    let q = parse(&qwen).unwrap();
    assert!(q.qk_norm);
    assert_eq!(
        q.moe.map(|m| (m.n_experts, m.top_k, m.expert_ffn_dim)),
        Some((128, 8, 768))
    );
    // A layer without experts is refused by name; so is choosing more than there are.
    let dense_layers = qwen.replace("\"mlp_only_layers\": []", "\"mlp_only_layers\": [0]");
    assert!(
        parse(&dense_layers)
            .unwrap_err()
            .to_string()
            .contains("mlp_only_layers")
    );
    let too_many = qwen.replace("\"num_experts_per_tok\": 8", "\"num_experts_per_tok\": 200");
    assert!(
        parse(&too_many)
            .unwrap_err()
            .to_string()
            .contains("num_experts_per_tok")
    );
    assert_eq!(parse(SMOLLM2).unwrap().moe, None);
}

#[test]
fn llama3_rope_scaling_and_eos_list() {
    let json = SMOLLM2.replace("49152", "128256").replace(
        "\"eos_token_id\": 2",
        r#""eos_token_id": [128001, 128009], "rope_scaling": {"rope_type": "llama3",
           "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 8192}"#,
    );
    let c = parse(&json).unwrap();
    assert_eq!(c.eos_tokens, vec![128001, 128009]);
    assert_eq!(
        c.rope_scaling,
        RopeScaling::Llama3 {
            factor: 32.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position: 8192
        }
    );
}

#[test]
fn transformers_5_rope_parameters() {
    let json = SMOLLM2.replace(
        "\"rope_theta\": 100000.0,",
        r#""rope_parameters": {"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0,
           "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 64},"#,
    );
    let c = parse(&json).unwrap();
    assert_eq!(c.rope_theta, 500000.0);
    assert!(matches!(
        c.rope_scaling,
        RopeScaling::Llama3 { factor: 8.0, .. }
    ));
}

#[test]
fn bad_configs_name_the_problem() {
    let e = parse(&SMOLLM2.replace("LlamaForCausalLM", "GPT2LMHeadModel")).unwrap_err();
    assert!(e.to_string().contains("GPT2LMHeadModel"), "{e}");
    assert!(e.to_string().contains("architectures"), "{e}");
    let e = parse(&SMOLLM2.replace("\"hidden_size\": 576,", "")).unwrap_err();
    assert_eq!(e.to_string(), "config: missing field `hidden_size`");
    let e = parse(&SMOLLM2.replace("\"num_key_value_heads\": 3", "\"num_key_value_heads\": 4"))
        .unwrap_err();
    assert!(e.to_string().contains("not a multiple"), "{e}");
    let e = parse(&SMOLLM2.replace(
        "\"eos_token_id\": 2",
        r#""eos_token_id": 2, "rope_scaling": {"type": "yarn", "factor": 4.0}"#,
    ))
    .unwrap_err();
    assert!(e.to_string().contains("yarn"), "{e}");
}

fn with(field: &str, value: &str) -> String {
    let json: serde_json::Value = serde_json::from_str(SMOLLM2).unwrap();
    let mut json = json.as_object().unwrap().clone();
    json.insert(field.into(), serde_json::from_str(value).unwrap());
    serde_json::Value::Object(json).to_string()
}

fn refused(field: &str, value: &str) -> String {
    parse(&with(field, value)).unwrap_err().to_string()
}

#[test]
fn sizes_past_the_limits_are_refused_before_they_multiply() {
    // Values whose products wrap to plausible shapes (2^63 + 4 heads of 16 are 64 wide
    // modulo 2^64) are refused by the bound on each factor.
    assert_eq!(
        refused("head_dim", "9223372036854775824"),
        "config: `head_dim` is 9223372036854775824, more than rustle's limit of 1024"
    );
    assert_eq!(
        refused("num_attention_heads", "9223372036854775812"),
        "config: `num_attention_heads` is 9223372036854775812, more than rustle's limit of 1024"
    );
    assert_eq!(
        refused("num_hidden_layers", "4294967296"),
        "config: `num_hidden_layers` is 4294967296, more than rustle's limit of 1024"
    );
    assert_eq!(
        refused("vocab_size", "18446744073709551615"),
        "config: `vocab_size` is 18446744073709551615, more than rustle's limit of 4194304"
    );
    assert_eq!(
        refused("max_position_embeddings", "16777217"),
        "config: `max_position_embeddings` is 16777217, more than rustle's limit of 16777216"
    );
    let wide = parse(
        &with("head_dim", "1024")
            .replace("\"num_attention_heads\":9", "\"num_attention_heads\":96"),
    )
    .unwrap_err()
    .to_string();
    assert_eq!(
        wide,
        "config: `num_attention_heads` 96 times `head_dim` 1024 is 98304, more than rustle's limit of 65536"
    );
    // The largest configuration the limits allow still counts its parameters in u64.
    let c = parse(&SMOLLM2.replace("49152", "4194304")).unwrap();
    assert!(c.n_params() > 0);
}

#[test]
fn zero_and_odd_head_dims_are_named_for_what_they_are() {
    assert_eq!(
        refused("head_dim", "0"),
        "config: `head_dim` must be positive"
    );
    assert_eq!(
        refused("head_dim", "63"),
        "config: `head_dim` 63 must be even for RoPE"
    );
}

#[test]
fn values_outside_their_meaning_are_refused() {
    assert_eq!(
        refused("rms_norm_eps", "-1"),
        "config: `rms_norm_eps` is -1; it must be a small positive number such as 1e-5"
    );
    assert_eq!(
        refused("rms_norm_eps", "1e-50"),
        "config: `rms_norm_eps` is 1e-50; it must be a small positive number such as 1e-5"
    );
    assert_eq!(
        refused("rope_theta", "0"),
        "config: `rope_theta` is 0; it must be a finite number above 1 such as 10000"
    );
    assert_eq!(
        refused("rope_theta", "0.5"),
        "config: `rope_theta` is 0.5; it must be a finite number above 1 such as 10000"
    );
    assert_eq!(
        refused("rope_scaling", r#"{"rope_type": "linear", "factor": 0.5}"#),
        "config: `rope_scaling` \"linear\": `factor` is 0.5; it must be finite and at least 1"
    );
    assert_eq!(
        refused(
            "rope_scaling",
            r#"{"rope_type": "llama3", "factor": 8, "low_freq_factor": -1,
                "high_freq_factor": 4, "original_max_position_embeddings": 8192}"#
        ),
        "config: `rope_scaling` \"llama3\": `low_freq_factor` is -1; it must be positive"
    );
    assert_eq!(
        refused("eos_token_id", "49152"),
        "config: `eos_token_id` 49152 is outside the vocabulary of 49152"
    );
}

#[test]
fn messages_name_fields_as_the_source_spells_them() {
    let hf: HfConfig = serde_json::from_str(&with("head_dim", "0")).unwrap();
    let e = Config::resolve_named(&hf, &|f| format!("<{f}>")).unwrap_err();
    assert_eq!(e.to_string(), "config: <head_dim> must be positive");
}

/// Gemma 3 1B's `config.json` (transformers 4.5x), its layers cut to 8.
const GEMMA3: &str = r#"{
    "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
    "hidden_size": 1152, "intermediate_size": 6912, "num_hidden_layers": 8,
    "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
    "vocab_size": 262144, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "rope_scaling": null,
    "query_pre_attn_scalar": 256, "sliding_window": 512, "sliding_window_pattern": 6,
    "hidden_activation": "gelu_pytorch_tanh", "final_logit_softcapping": null,
    "attn_logit_softcapping": null, "torch_dtype": "bfloat16", "bos_token_id": 2,
    "eos_token_id": [1, 106]
}"#;

#[test]
fn gemma3_reads_its_window_activation_and_scales() {
    let c = parse(GEMMA3).unwrap();
    assert_eq!(c.arch, Arch::Gemma3);
    assert_eq!(c.activation, Activation::GeluTanh);
    assert!(c.qk_norm && c.post_norms && !c.qkv_bias);
    assert_eq!(c.norm_offset, 1.0);
    // sqrt(1152) = 33.94, which bf16 rounds to 34.
    assert_eq!(c.embed_scale, Some(34.0));
    assert_eq!(c.query_scale, 1.0);
    // Not Mistral's cap: the window is the local layers', not the context's.
    assert_eq!(c.max_seq_len, 32768);
    let windows: Vec<_> = (0..8).map(|l| c.window(l)).collect();
    let local = Some(512);
    assert_eq!(
        windows,
        [local, local, local, local, local, None, local, local]
    );
    assert_eq!(c.sliding.as_ref().unwrap().rope_theta, Some(10000.0));
    // layer_types wins over the pattern; query_pre_attn_scalar scales the queries.
    let c = parse(
        &GEMMA3
            .replace(
                "\"sliding_window_pattern\": 6,",
                r#""layer_types": ["full_attention", "sliding_attention", "sliding_attention",
            "full_attention", "sliding_attention", "sliding_attention", "full_attention",
            "sliding_attention"], "sliding_window_pattern": 6,"#,
            )
            .replace(
                "\"query_pre_attn_scalar\": 256",
                "\"query_pre_attn_scalar\": 64",
            ),
    )
    .unwrap();
    assert_eq!(c.window(0), None);
    assert_eq!(c.window(1), Some(512));
    assert_eq!(c.query_scale, 2.0);
}

#[test]
fn gemma3_rope_parameters_by_kind_of_layer() {
    let json = GEMMA3.replace(
        "\"rope_theta\": 1000000.0, \"rope_local_base_freq\": 10000.0, \"rope_scaling\": null,",
        r#""rope_parameters": {
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 20000.0}},"#,
    );
    let c = parse(&json).unwrap();
    assert_eq!(c.rope_theta, 1000000.0);
    assert_eq!(c.rope_scaling, RopeScaling::Linear { factor: 8.0 });
    assert_eq!(c.sliding.unwrap().rope_theta, Some(20000.0));
}

#[test]
fn gemma3_bad_fields_are_refused_by_name() {
    let e = parse(&GEMMA3.replace(
        "\"final_logit_softcapping\": null",
        "\"final_logit_softcapping\": 30.0",
    ))
    .unwrap_err();
    assert!(e.to_string().contains("final_logit_softcapping"), "{e}");
    let e = parse(&GEMMA3.replace("gelu_pytorch_tanh", "relu")).unwrap_err();
    assert!(e.to_string().contains("hidden_activation"), "{e}");
    let e = parse(&GEMMA3.replace("\"sliding_window\": 512,", "")).unwrap_err();
    assert!(e.to_string().contains("sliding_window"), "{e}");
    let e = parse(&GEMMA3.replace(
        "\"sliding_window_pattern\": 6,",
        r#""layer_types": ["full_attention"],"#,
    ))
    .unwrap_err();
    assert!(e.to_string().contains("layer_types"), "{e}");
    let e = parse(&GEMMA3.replace(
        "\"query_pre_attn_scalar\": 256",
        "\"query_pre_attn_scalar\": -1",
    ))
    .unwrap_err();
    assert!(e.to_string().contains("query_pre_attn_scalar"), "{e}");
}

/// Gemma 3 4B's `config.json` as its files have it: the language model's fields in
/// `text_config`, the others left to transformers' defaults.
#[test]
fn a_multimodal_gemma3_resolves_to_its_language_model() {
    let json = r#"{
        "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
        "boi_token_index": 255999, "eos_token_id": [1, 106], "torch_dtype": "bfloat16",
        "text_config": {"hidden_size": 2560, "intermediate_size": 10240,
            "model_type": "gemma3_text", "num_hidden_layers": 34,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024},
        "vision_config": {"hidden_size": 1152, "model_type": "siglip_vision_model"}
    }"#;
    let hf: HfConfig = serde_json::from_str(json).unwrap();
    let c = Config::resolve(&hf.language_model()).unwrap();
    assert_eq!(c.arch, Arch::Gemma3);
    assert_eq!(
        (
            c.dim,
            c.n_layers,
            c.n_heads,
            c.n_kv_heads,
            c.head_dim,
            c.vocab_size
        ),
        (2560, 34, 8, 4, 256, 262_208)
    );
    assert_eq!(c.rope_theta, 1_000_000.0);
    assert_eq!(c.rope_scaling, RopeScaling::Linear { factor: 8.0 });
    assert_eq!((c.window(0), c.window(5)), (Some(1024), None));
    assert_eq!(c.eos_tokens, vec![1, 106]);
    assert!(c.tie_embeddings);
    // sqrt(2560) = 50.6, 50.5 in bf16.
    assert_eq!(c.embed_scale, Some(50.5));
}
