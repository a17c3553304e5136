//! Structured output in the OpenAI API: `response_format` (`json_object`, `json_schema`)
//! and `tools` / `tool_choice`, turned into a grammar for the engine (`constrain`) and, for
//! tools, the model's tool-call text parsed back into OpenAI's `tool_calls`.
//!
//! A model is told about tools by its chat template (the `tools` variable) and answers in
//! the format its template teaches, one of two:
//! - tagged (Qwen2.5 and later, Hermes and the many templates after them): each call a JSON
//!   object `{"name": ..., "arguments": {...}}` between `<tool_call>` and `</tool_call>`;
//! - bare JSON (Llama 3.1 and later): the whole reply one object `{"name": ..., "parameters":
//!   {...}}`.
//!
//! With `tool_choice` `auto` the model decides, and a reply that holds calls in its format
//! is parsed into them; with `required` or a named function the reply is held to a grammar
//! of calls in that format, so it always parses.

use serde_json::{Map, Value, json};

use super::errors::ApiError;
use crate::constrain::{GrammarSpec, with_layout};

/// How a model writes its tool calls (read from its chat template).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    /// `<tool_call>{"name": ..., "arguments": ...}</tool_call>`, one block per call.
    Tagged,
    /// One JSON object `{"name": ..., "parameters": ...}` as the whole reply.
    Json,
}

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

impl ToolFormat {
    /// The format a chat template teaches, `None` when it never renders `tools`.
    pub fn of_template(template: &str) -> Option<ToolFormat> {
        if !template.contains("tools") {
            return None;
        }
        Some(match template.contains(OPEN) {
            true => ToolFormat::Tagged,
            false => ToolFormat::Json,
        })
    }

    /// The key of a call's arguments.
    fn arguments_key(self) -> &'static str {
        match self {
            ToolFormat::Tagged => "arguments",
            ToolFormat::Json => "parameters",
        }
    }
}

/// Which tool calls a request allows.
#[derive(Clone, Debug, PartialEq)]
pub enum ToolChoice {
    /// The model may answer in text or call any tool.
    Auto,
    /// The model must call one or more tools.
    Required,
    /// The model must call this function.
    Named(String),
}

/// A request's tools: the function definitions (as the template receives them) and the
/// choice.
#[derive(Clone, Debug, PartialEq)]
pub struct Tools {
    /// Each `{"type": "function", "function": {"name", "description", "parameters"}}`.
    pub list: Vec<Value>,
    pub choice: ToolChoice,
}

/// One parsed call.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    pub name: String,
    /// The arguments as a JSON text, as OpenAI sends them.
    pub arguments: String,
}

fn invalid(param: &str, why: impl std::fmt::Display) -> ApiError {
    ApiError::invalid(format!("Invalid value for '{param}': {why}"), Some(param))
        .with_code("invalid_value")
}

/// `response_format` as a grammar: `text` none, `json_object` any object, `json_schema`
/// its `schema` (or any JSON value without one).
pub fn response_format(f: Option<Map<String, Value>>) -> Result<Option<GrammarSpec>, ApiError> {
    let Some(f) = f else { return Ok(None) };
    let param = "response_format";
    match f.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(GrammarSpec::JsonObject)),
        Some("json_schema") => {
            let Some(Value::Object(spec)) = f.get("json_schema") else {
                return Err(invalid(
                    param,
                    "'json_schema' needs an object {\"name\", \"schema\"}",
                ));
            };
            if !spec.get("name").is_some_and(Value::is_string) {
                return Err(invalid(param, "'json_schema.name' must be a string"));
            }
            match spec.get("schema") {
                None => Ok(Some(GrammarSpec::JsonSchema(json!({})))),
                Some(s @ (Value::Object(_) | Value::Bool(true))) => {
                    Ok(Some(GrammarSpec::JsonSchema(s.clone())))
                }
                Some(_) => Err(invalid(param, "'json_schema.schema' must be an object")),
            }
        }
        Some(other) => Err(invalid(
            param,
            format!("type '{other}' is not one of text, json_object, json_schema"),
        )),
        None => Err(invalid(param, "'type' is missing")),
    }
}

/// `tools` and `tool_choice`, checked: `None` when no tool may be called (no tools, or
/// `tool_choice` `none`).
pub fn tools(tools: Option<Value>, choice: Option<Value>) -> Result<Option<Tools>, ApiError> {
    let list = match tools {
        None => vec![],
        Some(Value::Array(list)) => list,
        Some(_) => return Err(invalid("tools", "an array of tools")),
    };
    let mut names = vec![];
    for (i, t) in list.iter().enumerate() {
        let param = format!("tools[{i}]");
        if t.get("type").and_then(Value::as_str) != Some("function") {
            return Err(invalid(&param, "'type' must be 'function'"));
        }
        let Some(f) = t.get("function").and_then(Value::as_object) else {
            return Err(invalid(&param, "'function' must be an object"));
        };
        let name = f.get("name").and_then(Value::as_str).unwrap_or("");
        let good = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
        if name.is_empty() || name.len() > 64 || !name.chars().all(good) {
            return Err(invalid(
                &format!("{param}.function.name"),
                "1 to 64 letters, digits, '_' or '-'",
            ));
        }
        if f.get("parameters").is_some_and(|p| !p.is_object()) {
            return Err(invalid(
                &format!("{param}.function.parameters"),
                "a JSON Schema object",
            ));
        }
        names.push(name);
    }
    let choice = match choice {
        None if list.is_empty() => return Ok(None),
        None => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "none" => return Ok(None),
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            _ => {
                return Err(invalid(
                    "tool_choice",
                    format!("'{s}' is not one of none, auto, required"),
                ));
            }
        },
        Some(c) => match c.pointer("/function/name").and_then(Value::as_str) {
            Some(name) if c.get("type").and_then(Value::as_str) == Some("function") => {
                if !names.contains(&name) {
                    return Err(invalid(
                        "tool_choice",
                        format!("function '{name}' is not among the tools"),
                    ));
                }
                ToolChoice::Named(name.to_string())
            }
            _ => {
                return Err(invalid(
                    "tool_choice",
                    "a string or {\"type\": \"function\", \"function\": {\"name\": ...}}",
                ));
            }
        },
    };
    if list.is_empty() {
        return Err(invalid("tool_choice", "needs 'tools'"));
    }
    Ok(Some(Tools { list, choice }))
}

impl Tools {
    /// Whether the reply must be calls (a grammar holds it to them).
    pub fn grammar_needed(&self) -> bool {
        self.choice != ToolChoice::Auto
    }
    /// The grammar a reply must follow: `None` for `auto`, else calls (one or more; one for a
    /// named function) in the model's format, each call's arguments held to its function's
    /// schema.
    pub fn grammar(&self, format: ToolFormat) -> Option<GrammarSpec> {
        let calls: Vec<Value> = self
            .list
            .iter()
            .filter_map(|t| t.get("function"))
            .filter(|f| match &self.choice {
                ToolChoice::Auto => false,
                ToolChoice::Required => true,
                ToolChoice::Named(n) => f.get("name").and_then(Value::as_str) == Some(n),
            })
            .map(|f| {
                let parameters = f
                    .get("parameters")
                    .cloned()
                    .unwrap_or(json!({"type": "object"}));
                json!({
                    "type": "object",
                    "properties": {
                        "name": {"const": f["name"]},
                        format.arguments_key(): parameters,
                    },
                    "required": ["name", format.arguments_key()],
                    "additionalProperties": false,
                })
            })
            .collect();
        if calls.is_empty() {
            return None;
        }
        let call = with_layout(json!({"anyOf": calls}));
        let lark = match (format, &self.choice) {
            (ToolFormat::Json, _) => format!("start: %json {call}"),
            (ToolFormat::Tagged, ToolChoice::Named(_)) => {
                format!("start: call\ncall: \"{OPEN}\\n\" %json {call} \"\\n{CLOSE}\"")
            }
            (ToolFormat::Tagged, _) => format!(
                "start: call (\"\\n\" call)*\ncall: \"{OPEN}\\n\" %json {call} \"\\n{CLOSE}\""
            ),
        };
        Some(GrammarSpec::Lark(lark))
    }
}

/// A reply's text split into its content and its tool calls: `None` when it holds no call
/// that parses (then it is all content).
pub fn parse_calls(text: &str, format: ToolFormat) -> Option<(String, Vec<ToolCall>)> {
    let call = |json: &str| -> Option<ToolCall> {
        let v: Value = serde_json::from_str(json.trim()).ok()?;
        let name = v.get("name")?.as_str()?.to_string();
        let args = v
            .get("arguments")
            .or_else(|| v.get("parameters"))
            .cloned()
            .unwrap_or(json!({}));
        // Some models write the arguments as a JSON string already.
        let arguments = match args {
            Value::String(s) => s,
            other => other.to_string(),
        };
        Some(ToolCall { name, arguments })
    };
    match format {
        ToolFormat::Json => call(text).map(|c| (String::new(), vec![c])),
        ToolFormat::Tagged => {
            let start = text.find(OPEN)?;
            let mut calls = vec![];
            for block in text[start..].split(OPEN).skip(1) {
                let body = block.split(CLOSE).next().unwrap_or(block);
                calls.push(call(body)?);
            }
            Some((text[..start].trim_end().to_string(), calls))
        }
    }
}

/// A streamed reply's text as it comes, for a request that may call tools: content goes out
/// as it comes, except what may be the start of a call, which is held until the reply ends
/// and then parsed.
#[derive(Clone, Debug)]
pub struct ToolStream {
    format: ToolFormat,
    /// The reply must be calls: nothing is sent as content until the end.
    hold_all: bool,
    /// Text not sent yet.
    held: String,
    /// Content has been sent: a bare-JSON call can no longer start.
    sent: bool,
    /// A call has started: everything from here on is held.
    in_call: bool,
}

impl ToolStream {
    pub fn new(format: ToolFormat, choice: &ToolChoice) -> ToolStream {
        ToolStream {
            format,
            hold_all: *choice != ToolChoice::Auto,
            held: String::new(),
            sent: false,
            in_call: false,
        }
    }

    /// Takes the next text; returns what may be sent as content now.
    pub fn push(&mut self, text: &str) -> String {
        self.held.push_str(text);
        if self.hold_all || self.in_call {
            return String::new();
        }
        let free = match self.format {
            ToolFormat::Json if self.sent => self.held.len(),
            ToolFormat::Json => match self.held.trim_start().chars().next() {
                None => 0,
                Some('{') => {
                    self.in_call = true;
                    0
                }
                Some(_) => self.held.len(),
            },
            ToolFormat::Tagged => match self.held.find(OPEN) {
                Some(at) => {
                    self.in_call = true;
                    at
                }
                // Hold the longest end that could still grow into the opening tag.
                None => {
                    let keep = (1..OPEN.len())
                        .rev()
                        .find(|&k| self.held.ends_with(&OPEN[..k]))
                        .unwrap_or(0);
                    self.held.len() - keep
                }
            },
        };
        let out: String = self.held.drain(..free).collect();
        self.sent |= !out.is_empty();
        out
    }

    /// At the reply's end: the calls, if the held text parses as calls, and the content not
    /// sent yet.
    pub fn finish(&mut self) -> (String, Vec<ToolCall>) {
        let held = std::mem::take(&mut self.held);
        match parse_calls(&held, self.format) {
            Some((content, calls)) => (content, calls),
            None => (held, vec![]),
        }
    }
}

/// A fresh call id, as OpenAI writes them (`call_` and 24 letters and digits).
pub fn call_id() -> String {
    format!(
        "call_{:016x}{:08x}",
        rand::random::<u64>(),
        rand::random::<u32>()
    )
}

/// A call as OpenAI's `tool_calls` entry (`index` for a streamed delta).
pub fn call_json(c: &ToolCall, index: Option<usize>) -> Value {
    let mut v = json!({
        "id": call_id(),
        "type": "function",
        "function": {"name": c.name, "arguments": c.arguments},
    });
    if let Some(i) = index {
        v["index"] = json!(i);
    }
    v
}

#[cfg(test)]
mod tests;
