//! Chat prompts: the model's own Jinja chat template (from `tokenizer_config.json` or the
//! GGUF metadata) rendered with `minijinja`, or ChatML when the model has none.

use minijinja::{Environment, ErrorKind, context};
use serde::Serialize;

use crate::error::{Error, Result};
use crate::tokenizer::Tokenizer;

#[derive(Clone, Debug, Serialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

/// ChatML, the format SmolLM2 and Qwen2 use, for models that carry no template.
const CHATML: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// The prompt text for `messages`, ending where the assistant's reply begins.
pub fn render(tok: &Tokenizer, messages: &[Message]) -> Result<String> {
    let template = tok.chat_template.as_deref().unwrap_or(CHATML);
    let mut env = Environment::new();
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
    env.get_template("chat")
        .and_then(|t| {
            t.render(context! {
                messages => messages,
                add_generation_prompt => true,
                bos_token => tok.bos_text,
                eos_token => tok.eos_text,
            })
        })
        .map_err(|e| Error::ChatTemplate(e.to_string()))
}
