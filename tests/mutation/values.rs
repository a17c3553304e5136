//! What mutations pick from and how they change bytes and JSON trees.

use rand::Rng;
use rand::rngs::StdRng;
use serde_json::{Value, json};

/// Counts, lengths, dimensions and offsets: small, at the edges of the tiny model's sizes,
/// at powers of two that wrap when multiplied, and the largest values a field can hold.
pub(crate) const INTERESTING: [u64; 36] = [
    0,
    1,
    2,
    3,
    4,
    7,
    8,
    15,
    16,
    31,
    32,
    33,
    48,
    64,
    255,
    256,
    1023,
    1024,
    1025,
    65535,
    65536,
    1 << 20,
    1 << 24,
    8_000_000,
    (1 << 31) - 1,
    1 << 31,
    (1 << 32) - 1,
    1 << 32,
    (1 << 32) + 1,
    1 << 40,
    1 << 62,
    1 << 63,
    (1 << 63) + 4,
    (1 << 63) + 16,
    u64::MAX - 1,
    u64::MAX,
];

/// A value for a field that held `orig`: a neighbour, a random one, one from `INTERESTING`,
/// or `orig` plus a power of two that a product with the other dimensions wraps back to the
/// original size (heads + 2^62 times head_dim 8 is heads times 8 again, modulo 2^64): the
/// values that once passed every shape check.
pub(crate) fn interesting(rng: &mut StdRng, orig: u64) -> u64 {
    match rng.random_range(0..12) {
        0 => orig.wrapping_add(1),
        1 => orig.wrapping_sub(1),
        2 => orig.wrapping_mul(2),
        3 => orig / 2,
        4 => rng.random(),
        5 | 6 => orig.wrapping_add(1 << *pick(rng, &[32, 60, 61, 62, 63])),
        _ => INTERESTING[rng.random_range(0..INTERESTING.len())],
    }
}

pub(crate) const FLOATS: [f64; 14] = [
    0.0,
    -0.0,
    -1.0,
    1.0,
    0.5,
    1e-40,
    1e-7,
    10000.0,
    1e30,
    1e300,
    f64::INFINITY,
    f64::NEG_INFINITY,
    f64::NAN,
    -1e-5,
];

pub(crate) fn pick<'a, T>(rng: &mut StdRng, items: &'a [T]) -> &'a T {
    &items[rng.random_range(0..items.len())]
}

pub(crate) fn truncate(rng: &mut StdRng, bytes: &mut Vec<u8>) -> String {
    let at = rng.random_range(0..bytes.len().max(1));
    bytes.truncate(at);
    format!("truncated at byte {at}")
}

/// Flips 1 to 8 bytes, mostly in the first `hot` bytes (the header).
pub(crate) fn flip(rng: &mut StdRng, bytes: &mut [u8], hot: usize) -> String {
    if bytes.is_empty() {
        return "nothing to flip".into();
    }
    let n = rng.random_range(1..=8);
    let mut at = vec![];
    for _ in 0..n {
        let limit = if rng.random_bool(0.7) {
            hot.clamp(1, bytes.len())
        } else {
            bytes.len()
        };
        let i = rng.random_range(0..limit);
        bytes[i] ^= 1 << rng.random_range(0..8);
        at.push(i);
    }
    format!("bits flipped at bytes {at:?}")
}

/// Values a JSON field that held `orig` may be given: numbers that wrap or mean nothing,
/// other types.
pub(crate) fn json_value(rng: &mut StdRng, orig: &Value) -> Value {
    match rng.random_range(0..12) {
        0..=3 => json!(interesting(rng, orig.as_u64().unwrap_or(16))),
        4 => json!(-(rng.random_range(1..1000) as i64)),
        5 => {
            let f = *pick(rng, &FLOATS);
            if f.is_finite() {
                json!(f)
            } else {
                json!(1e308)
            }
        }
        6 => json!(pick(
            rng,
            &["", "x", "llama3", "linear", "yarn", "default", "BPE"]
        )),
        7 => Value::Null,
        8 => json!(rng.random::<bool>()),
        9 => json!([1, 2]),
        10 => json!({}),
        _ => json!({"type": "x"}),
    }
}

/// A text-level mutation of serialized JSON: truncation or flipped bits.
pub(crate) fn mutate_text(rng: &mut StdRng, bytes: &mut Vec<u8>) -> String {
    if rng.random_bool(0.5) {
        truncate(rng, bytes)
    } else {
        let len = bytes.len();
        flip(rng, bytes, len)
    }
}

/// The paths of every node in `v` (object keys and array indices).
pub(crate) fn json_paths(
    v: &Value,
    prefix: &mut Vec<Value>,
    out: &mut Vec<Vec<Value>>,
    limit: usize,
) {
    if out.len() >= limit {
        return;
    }
    out.push(prefix.clone());
    match v {
        Value::Object(m) => {
            for (k, child) in m {
                prefix.push(json!(k));
                json_paths(child, prefix, out, limit);
                prefix.pop();
            }
        }
        Value::Array(a) => {
            for (i, child) in a.iter().enumerate().take(8) {
                prefix.push(json!(i));
                json_paths(child, prefix, out, limit);
                prefix.pop();
            }
        }
        _ => {}
    }
}

pub(crate) fn node<'a>(v: &'a mut Value, path: &[Value]) -> &'a mut Value {
    path.iter().fold(v, |v, p| match p {
        Value::String(k) => &mut v[k.as_str()],
        Value::Number(i) => &mut v[i.as_u64().unwrap() as usize],
        _ => unreachable!(),
    })
}

/// One change at a random place in a JSON tree: a new value, a component from `parts`, or
/// the entry removed.
pub(crate) fn mutate_tree(rng: &mut StdRng, v: &mut Value, parts: &[Value]) -> String {
    let mut paths = vec![];
    json_paths(v, &mut vec![], &mut paths, 4000);
    let path = pick(rng, &paths[1..]).clone();
    let shown: Vec<String> = path.iter().map(|p| p.to_string()).collect();
    let shown = shown.join(".");
    match rng.random_range(0..4) {
        0 if !parts.is_empty() => {
            let p = pick(rng, parts).clone();
            let d = format!("{shown} = {p}");
            *node(v, &path) = p;
            d
        }
        1 => {
            let (last, parent) = path.split_last().unwrap();
            match (node(v, parent), last) {
                (Value::Object(m), Value::String(k)) => {
                    m.remove(k);
                }
                (Value::Array(a), Value::Number(i)) => {
                    a.remove(i.as_u64().unwrap() as usize);
                }
                _ => {}
            }
            format!("{shown} removed")
        }
        _ => {
            let new = json_value(rng, node(v, &path));
            let d = format!("{shown} = {new}");
            *node(v, &path) = new;
            d
        }
    }
}

/// A little-endian number of 1 to 8 bytes.
pub(crate) fn read_le(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a[..b.len()].copy_from_slice(b);
    u64::from_le_bytes(a)
}
