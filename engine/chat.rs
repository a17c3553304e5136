//! Chat prompts: the model's own Jinja chat template (from the model folder or the GGUF
//! metadata) rendered with `minijinja`, or ChatML when the model has none.
//!
//! A template is a program from the model's files: its running time is bounded by
//! minijinja's fuel, and its output by the caller's byte limit (a prompt longer than the
//! context is refused before it is tokenized).

use std::io::Write;

use minijinja::{Environment, ErrorKind, context};
use serde::Serialize;
use serde_json::Value;

use crate::error::{Error, Result};
use crate::tokenizer::{MAX_BYTES_PER_TOKEN, Tokenizer};

#[derive(Clone, Debug, Serialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

/// ChatML, the format SmolLM2 and Qwen2 use, for models that carry no template.
const CHATML: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// Template instructions one rendering may run. Real templates (Llama 3.1's with tools
/// included) take a few thousand per message; a loop of millions is a broken template.
const FUEL: u64 = 5_000_000;

/// The output limit of `render`, for callers that do not know the context.
pub const DEFAULT_MAX_BYTES: usize = 16 << 20;

/// The prompt text for `messages`, ending where the assistant's reply begins.
pub fn render(tok: &Tokenizer, messages: &[Message]) -> Result<String> {
    render_within(tok, messages, DEFAULT_MAX_BYTES)
}

/// The most prompt bytes a context of `context` tokens could hold.
pub fn max_bytes_for_context(context: usize) -> usize {
    context.saturating_mul(MAX_BYTES_PER_TOKEN)
}

/// As `render`, stopping with an error as soon as the text passes `max_bytes`.
pub fn render_within(tok: &Tokenizer, messages: &[Message], max_bytes: usize) -> Result<String> {
    render_template(tok, messages, &[], max_bytes)
}

/// As `render_within`, for messages of any shape the template reads (an API request's, with
/// `tool_calls` and `tool` messages) and the `tools` it may offer the model (none: the
/// template's `tools` is undefined, as Hugging Face leaves it).
pub fn render_template<M: Serialize>(
    tok: &Tokenizer,
    messages: &[M],
    tools: &[Value],
    max_bytes: usize,
) -> Result<String> {
    let template = tok.chat_template.as_deref().unwrap_or(CHATML);
    let mut env = Environment::new();
    env.set_fuel(Some(FUEL));
    // Templates written for Python's Jinja call string methods (.strip(), .startswith()).
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function(
        "raise_exception",
        |msg: String| -> std::result::Result<String, minijinja::Error> {
            Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
        },
    );
    env.add_template("chat", template)
        .map_err(|e| Error::ChatTemplate(e.to_string()))?;
    let mut out = Bounded {
        text: vec![],
        max_bytes,
        overflowed: false,
    };
    let rendered = env.get_template("chat").and_then(|t| {
        t.render_captured_to(
            context! {
                messages => messages,
                tools => (!tools.is_empty()).then_some(tools),
                add_generation_prompt => true,
                bos_token => tok.bos_text,
                eos_token => tok.eos_text,
            },
            &mut out,
        )
        .map(drop)
    });
    if out.overflowed {
        return Err(Error::ChatTemplate(format!(
            "the rendered prompt passed {max_bytes} bytes, more than the model's context can hold"
        )));
    }
    rendered.map_err(|e| Error::ChatTemplate(e.to_string()))?;
    // minijinja writes whole UTF-8 strings, so the bytes are text.
    String::from_utf8(out.text)
        .map_err(|_| Error::ChatTemplate("the rendered prompt is not UTF-8".into()))
}

/// A writer that refuses to grow past `max_bytes`: rendering stops at the first write over.
struct Bounded {
    text: Vec<u8>,
    max_bytes: usize,
    overflowed: bool,
}

impl Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.text.len() + buf.len() > self.max_bytes {
            self.overflowed = true;
            return Err(std::io::Error::other("the prompt is too long"));
        }
        self.text.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A template in the form Gemma 3's files carry: the system prompt folded into the first
    /// user turn (`messages[1:]`, `loop.first`), the assistant's turns as `model`, content
    /// trimmed, roles that do not alternate refused through `raise_exception`.
    const GEMMA_STYLE: &str = "{{ bos_token }}\
{%- if messages[0]['role'] == 'system' -%}\
{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}\
{%- set loop_messages = messages[1:] -%}\
{%- else -%}\
{%- set first_user_prefix = '' -%}\
{%- set loop_messages = messages -%}\
{%- endif -%}\
{%- for message in loop_messages -%}\
{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\
{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}\
{%- endif -%}\
{%- if message['role'] == 'assistant' -%}{%- set role = 'model' -%}\
{%- else -%}{%- set role = message['role'] -%}{%- endif -%}\
{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}\
{%- if message['content'] is string -%}{{ message['content'] | trim }}\
{%- else -%}{{ raise_exception('Invalid content type') }}{%- endif -%}\
{{ '<end_of_turn>\n' }}\
{%- endfor -%}\
{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}";

    fn message(role: &str, content: &str) -> Message {
        Message {
            role: role.into(),
            content: content.into(),
        }
    }

    #[test]
    fn a_gemma_style_template_renders_and_refuses_bad_turns() {
        let mut tok =
            Tokenizer::from_hf_folder(std::path::Path::new("tests/golden/tiny-gemma3"), &[], None)
                .unwrap();
        tok.chat_template = Some(GEMMA_STYLE.into());
        tok.bos_text = "<bos>".into();
        let messages = [
            message("system", "Be brief."),
            message("user", " Hi "),
            message("assistant", "Hello."),
            message("user", "Why?"),
        ];
        assert_eq!(
            render(&tok, &messages).unwrap(),
            "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n\
             <start_of_turn>model\nHello.<end_of_turn>\n\
             <start_of_turn>user\nWhy?<end_of_turn>\n<start_of_turn>model\n"
        );
        let e = render(&tok, &[message("assistant", "first")]).unwrap_err();
        assert!(e.to_string().contains("must alternate"), "{e}");
    }
}
