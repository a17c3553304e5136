//! Matrices some models store fused or stacked, split into the ones the forward pass takes
//! by name.
//!
//! Phi-3 keeps q, k and v in one matrix (`qkv_proj`, GGUF `attn_qkv`) and gate and up in
//! another (`gate_up_proj`; GGUF's `ffn_up` holds both). GGUF files keep every expert's
//! gate, up or down of a layer in one 3-D tensor (`ffn_gate_exps`, `[experts, rows, cols]`).
//! Each is whole rows of its parts one after another, and a row of any stored type (floats
//! or quantized blocks) is a run of bytes of its own, so a part is a range of the fused
//! tensor's bytes: nothing is copied, and the GPU still finds the parts' blocks as the files
//! store them. Mixtral's folders name the experts their own way (`block_sparse_moe.experts.
//! E.w1`); they are renamed to the names the model asks for (`mlp.experts.E.gate_proj`).

use super::{RawTensor, Weights};
use crate::config::{Arch, Config};
use crate::error::{Error, Result};

/// Splits the fused matrices of `c`'s architecture in `w` into their parts' names (a model
/// whose files already hold the parts is left as it is).
pub fn split_fused(c: &Config, w: &mut Weights) -> Result<()> {
    if let Some(moe) = c.moe {
        rename_mixtral(w);
        for l in 0..c.n_layers {
            for (part, rows, cols) in [
                ("gate_proj", moe.expert_ffn_dim, c.dim),
                ("up_proj", moe.expert_ffn_dim, c.dim),
                ("down_proj", c.dim, moe.expert_ffn_dim),
            ] {
                let stacked = format!("model.layers.{l}.mlp.experts.{part}.weight");
                let parts: Vec<(String, usize)> = (0..moe.n_experts)
                    .map(|e| {
                        (
                            format!("model.layers.{l}.mlp.experts.{e}.{part}.weight"),
                            rows,
                        )
                    })
                    .collect();
                // `[experts, rows, cols]` is `[experts * rows, cols]` in the same bytes.
                if let Some(t) = w.tensors.get_mut(&stacked)
                    && t.shape.len() == 3
                {
                    t.shape = vec![t.shape[0] * t.shape[1], t.shape[2]];
                }
                split(w, &stacked, &parts, cols)?;
            }
        }
    }
    if c.arch != Arch::Phi3 {
        return Ok(());
    }
    let (q, kv, ffn) = (c.q_dim(), c.kv_dim(), c.ffn_dim);
    for l in 0..c.n_layers {
        let name = |s: &str| format!("model.layers.{l}.{s}.weight");
        let attention = [
            ("self_attn.q_proj", q),
            ("self_attn.k_proj", kv),
            ("self_attn.v_proj", kv),
        ];
        split(
            w,
            &name("self_attn.qkv_proj"),
            &attention.map(|(s, n)| (name(s), n)),
            c.dim,
        )?;
        // GGUF's `ffn_up` (read as `mlp.up_proj`) holds gate and up when it has twice the rows.
        let mlp = [("mlp.gate_proj", ffn), ("mlp.up_proj", ffn)].map(|(s, n)| (name(s), n));
        let fused_up = w
            .tensors
            .get(&name("mlp.up_proj"))
            .is_some_and(|t| t.shape.first() == Some(&(2 * ffn)));
        let gate_up = match fused_up {
            true => name("mlp.up_proj"),
            false => name("mlp.gate_up_proj"),
        };
        split(w, &gate_up, &mlp, c.dim)?;
    }
    Ok(())
}

/// Mixtral's names for a layer's router and experts, as the model asks for them.
fn rename_mixtral(w: &mut Weights) {
    let renamed: Vec<(String, String)> = w
        .tensors
        .keys()
        .filter(|k| k.contains(".block_sparse_moe."))
        .map(|k| {
            let new = k
                .replace(".block_sparse_moe.", ".mlp.")
                .replace(".w1.weight", ".gate_proj.weight")
                .replace(".w3.weight", ".up_proj.weight")
                .replace(".w2.weight", ".down_proj.weight");
            (k.clone(), new)
        })
        .collect();
    for (old, new) in renamed {
        if let Some(t) = w.tensors.remove(&old) {
            w.tensors.insert(new, t);
        }
    }
}

/// Replaces `fused` (if the files have it) by `parts`, each `(name, rows)` of `cols`
/// columns, in order.
fn split(w: &mut Weights, fused: &str, parts: &[(String, usize)], cols: usize) -> Result<()> {
    let Some(t) = w.tensors.remove(fused) else {
        return Ok(());
    };
    let rows: usize = parts.iter().map(|p| p.1).sum();
    if t.shape != [rows, cols] || t.n_bytes % rows != 0 {
        return Err(Error::WeightMismatch {
            name: fused.to_owned(),
            want: format!("[{rows}, {cols}]"),
            found: format!("{:?} {}", t.shape, t.dtype),
        });
    }
    let row_bytes = t.n_bytes / rows;
    let mut first = 0;
    for (name, n) in parts {
        let part = RawTensor {
            offset: t.offset + first * row_bytes,
            n_bytes: n * row_bytes,
            shape: vec![*n, cols],
            ..t.clone()
        };
        w.tensors.insert(name.clone(), part);
        first += n;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::DType;

    #[test]
    fn a_fused_matrix_becomes_byte_ranges_of_its_parts() {
        let mut w = Weights {
            files: vec![],
            tensors: Default::default(),
        };
        // 6 rows of 4 f32 columns: 16 bytes a row.
        let fused = RawTensor {
            file: 0,
            offset: 100,
            n_bytes: 6 * 16,
            dtype: DType::F32,
            shape: vec![6, 4],
        };
        w.tensors.insert("qkv".into(), fused);
        let parts = [
            ("q".to_owned(), 2),
            ("k".to_owned(), 1),
            ("v".to_owned(), 3),
        ];
        split(&mut w, "qkv", &parts, 4).unwrap();
        assert!(!w.contains("qkv"));
        let at = |n: &str| {
            (
                w.tensors[n].offset,
                w.tensors[n].n_bytes,
                w.tensors[n].shape.clone(),
            )
        };
        assert_eq!(at("q"), (100, 32, vec![2, 4]));
        assert_eq!(at("k"), (132, 16, vec![1, 4]));
        assert_eq!(at("v"), (148, 48, vec![3, 4]));
        // A fused matrix of the wrong size is named.
        let wrong = RawTensor {
            file: 0,
            offset: 0,
            n_bytes: 16,
            dtype: DType::F32,
            shape: vec![1, 4],
        };
        w.tensors.insert("gate_up".into(), wrong);
        let err = split(&mut w, "gate_up", &parts, 4).unwrap_err().to_string();
        assert!(err.contains("gate_up") && err.contains("[6, 4]"), "{err}");
    }
}
