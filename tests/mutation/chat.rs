//! Chat templates: snippets inserted (loops, huge repetitions, recursion, errors, broken
//! syntax), spans removed or doubled, truncation, characters changed.

use std::time::Instant;

use libtest_mimic::Failed;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rustle::chat::{self, Message};
use rustle::tokenizer::Tokenizer;

use crate::common::tiny;
use crate::tally::{Outcome, Tally};
use crate::values::pick;

/// Templates as models ship them: the tiny one, ChatML, and a Llama-3-like one with a
/// system message and `raise_exception`.
pub(crate) const TEMPLATES: [&str; 3] = [
    tiny::CHAT_TEMPLATE,
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set system = messages[0]['content'] %}{% set messages = messages[1:] %}{% else %}{% set system = '' %}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate') }}{% endif %}<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n{{ message['content'] | trim }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}",
];

/// Pieces a mutation inserts: loops, huge repetitions (the campaign's 100 MB prompt),
/// recursion, errors, broken syntax.
pub(crate) const SNIPPETS: [&str; 26] = [
    "{% for i in range(100000) %}x{% endfor %}",
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "{{ 'x' * 100000000 }}",
    "{{ 'ab' * 99999999999 }}",
    "{{ messages * 100000 }}",
    "{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}",
    "{{ raise_exception('no') }}",
    "{{ messages[0].content.strip() }}",
    "{{ messages|tojson }}",
    "{% set x = [1, 2] * 50000 %}{{ x|length }}",
    "{{ 10 ** 1000 }}",
    "{{ 1 // 0 }}",
    "{% include 'other' %}",
    "{% extends 'base' %}",
    "{{ range(1000000000) }}",
    "{% for m in messages recursive %}{{ loop(messages) }}{% endfor %}",
    "{{ messages[99].content }}",
    "{{ bos_token ~ eos_token }}",
    "{% if %}",
    "{{",
    "{%",
    "}}",
    "{# open comment",
    "{{ 'x'.split('') }}",
    "{% for i in range(10) %}{{ '\u{1F980}' * 1000 }}{% endfor %}",
    "{{ messages|map(attribute='content')|join('\\n' * 1000) }}",
];

pub(crate) fn cases(n: usize) -> Result<(), Failed> {
    let started = Instant::now();
    let dir = tiny::scratch_dir("mutation-chat");
    tiny::write_hf_folder(&dir);
    let mut tok = Tokenizer::from_hf_folder(&dir, &[260], None).unwrap();
    let messages = vec![
        Message {
            role: "system".into(),
            content: "Be brief.".into(),
        },
        Message {
            role: "user".into(),
            content: "the hello 12".into(),
        },
    ];
    // The tiny model's context at the engine's bytes per token.
    let max_bytes = chat::max_bytes_for_context(tiny::CONTEXT);
    let mut tally = Tally::default();
    for case in 0..n {
        let seed = 5_000_000 + case as u64;
        let mut rng = StdRng::seed_from_u64(seed);
        let mut t: Vec<char> = pick(&mut rng, &TEMPLATES).chars().collect();
        let mut what = vec![];
        for _ in 0..rng.random_range(1..=3) {
            let at = rng.random_range(0..=t.len());
            what.push(match rng.random_range(0..6) {
                0 | 1 => {
                    let s = *pick(&mut rng, &SNIPPETS);
                    t.splice(at..at, s.chars());
                    format!("{s:?} at {at}")
                }
                2 => {
                    let end = (at + rng.random_range(1..20)).min(t.len());
                    t.drain(at..end);
                    format!("chars {at}..{end} removed")
                }
                3 => {
                    let end = (at + rng.random_range(1..40)).min(t.len());
                    let copy: Vec<char> = t[at..end].to_vec();
                    t.splice(at..at, copy);
                    format!("chars {at}..{end} doubled")
                }
                4 => {
                    t.truncate(at);
                    format!("cut at {at}")
                }
                _ => {
                    let c = *pick(
                        &mut rng,
                        &['{', '}', '%', '#', '(', ')', '\'', '"', '|', '9'],
                    );
                    if at < t.len() {
                        t[at] = c;
                    }
                    format!("char {at} = {c:?}")
                }
            });
        }
        tok.chat_template = Some(t.into_iter().collect());
        let name = format!("chat template seed {seed}: {}", what.join("; "));
        tally.run(name, || {
            match chat::render_within(&tok, &messages, max_bytes)
                .and_then(|text| tok.encode_prompt(&text, false, tiny::CONTEXT))
            {
                Err(e) => Outcome::Refused(e.to_string()),
                Ok(_) => Outcome::Loaded(true),
            }
        });
    }
    tally.finish("chat", started)
}
