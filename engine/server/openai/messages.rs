//! Chat messages as the request sends them, checked into the values the chat template reads:
//! roles, text content (a string or text parts), an assistant's `tool_calls` and a tool's
//! result.

use serde_json::{Value, json};

use crate::server::errors::{ApiError, missing, out_of_range, unsupported};

/// Chat messages with text content: system (or developer), user, assistant (whose content
/// may be absent when it made tool calls) and tool (a call's result).
pub(super) fn messages(list: Vec<Value>) -> Result<Vec<Value>, ApiError> {
    if list.is_empty() {
        return Err(out_of_range("messages", "at least one message is needed"));
    }
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.into_iter().enumerate() {
        let at = |field: &str| format!("messages[{i}].{field}");
        let Value::Object(mut m) = m else {
            return Err(ApiError::invalid(
                format!("Invalid type for 'messages[{i}]': an object"),
                Some(&format!("messages[{i}]")),
            ));
        };
        m.retain(|_, v| !v.is_null());
        for key in m.keys() {
            match key.as_str() {
                "role" | "content" | "name" | "tool_calls" | "tool_call_id" => {}
                "function_call" => {
                    return Err(unsupported(&at(key), "is not supported: use 'tool_calls'"));
                }
                "audio" => {
                    return Err(unsupported(
                        &at(key),
                        "is not supported: rustle takes text only",
                    ));
                }
                _ => {
                    return Err(ApiError::invalid(
                        format!("Unrecognized field in a message: {}", at(key)),
                        Some(&at(key)),
                    ));
                }
            }
        }
        let role = match m.get("role") {
            None => return Err(missing(&at("role"))),
            Some(Value::String(r)) => r.as_str(),
            Some(_) => {
                return Err(ApiError::invalid(
                    format!("Invalid type for '{}': a string", at("role")),
                    Some(&at("role")),
                ));
            }
        };
        let role = match role {
            "system" | "developer" => "system",
            "user" | "assistant" | "tool" => role,
            "function" => {
                return Err(unsupported(
                    &at("role"),
                    "'function' is not supported: use 'tool'",
                ));
            }
            other => {
                return Err(out_of_range(
                    &at("role"),
                    format!("'{other}' is not one of system, developer, user, assistant, tool"),
                ));
            }
        };
        let tool_calls = match m.get("tool_calls") {
            Some(_) if role != "assistant" => {
                return Err(unsupported(
                    &at("tool_calls"),
                    "belongs to assistant messages",
                ));
            }
            Some(calls) => Some(tool_calls(calls, &at("tool_calls"))?),
            None => None,
        };
        let content = match m.get("content") {
            None if tool_calls.is_some() => String::new(),
            None => return Err(missing(&at("content"))),
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(parts)) => {
                let mut text = String::new();
                for (j, p) in parts.iter().enumerate() {
                    let param = format!("messages[{i}].content[{j}]");
                    match (
                        p.get("type").and_then(Value::as_str),
                        p.get("text").and_then(Value::as_str),
                    ) {
                        (Some("text"), Some(t)) => text.push_str(t),
                        (Some("text"), None) => return Err(missing(&format!("{param}.text"))),
                        (Some(kind), _) => {
                            return Err(unsupported(
                                &param,
                                &format!(
                                    "of type '{kind}' is not supported: rustle takes text only"
                                ),
                            ));
                        }
                        (None, _) => return Err(missing(&format!("{param}.type"))),
                    }
                }
                text
            }
            Some(_) => {
                return Err(ApiError::invalid(
                    format!(
                        "Invalid type for '{}': a string or an array of text parts",
                        at("content")
                    ),
                    Some(&at("content")),
                ));
            }
        };
        let mut message = json!({"role": role, "content": content});
        if let Some(calls) = tool_calls {
            message["tool_calls"] = calls;
        }
        if role == "tool" {
            match m.get("tool_call_id") {
                Some(Value::String(id)) => message["tool_call_id"] = json!(id),
                None => return Err(missing(&at("tool_call_id"))),
                Some(_) => {
                    return Err(ApiError::invalid(
                        format!("Invalid type for '{}': a string", at("tool_call_id")),
                        Some(&at("tool_call_id")),
                    ));
                }
            }
        }
        if let Some(Value::String(name)) = m.get("name") {
            message["name"] = json!(name);
        }
        out.push(message);
    }
    Ok(out)
}

/// An assistant message's `tool_calls`, each `{"id", "type": "function", "function":
/// {"name", "arguments"}}`, as templates read them: the arguments, a JSON text in the API,
/// parsed into a value.
fn tool_calls(calls: &Value, param: &str) -> Result<Value, ApiError> {
    let bad = || {
        ApiError::invalid(
            format!(
                "Invalid value for '{param}': an array of {{\"id\", \"type\": \"function\", \"function\": {{\"name\", \"arguments\"}}}}"
            ),
            Some(param),
        )
    };
    let list = calls.as_array().ok_or_else(bad)?;
    let mut out = Vec::with_capacity(list.len());
    for c in list {
        let f = c.get("function").ok_or_else(bad)?;
        let name = f.get("name").and_then(Value::as_str).ok_or_else(bad)?;
        let arguments = match f.get("arguments") {
            Some(Value::String(text)) => serde_json::from_str(text).map_err(|e| {
                ApiError::invalid(
                    format!("Invalid value for '{param}': arguments are not JSON: {e}"),
                    Some(param),
                )
            })?,
            Some(v @ Value::Object(_)) => v.clone(),
            _ => return Err(bad()),
        };
        let id = c.get("id").cloned().unwrap_or(Value::Null);
        out.push(json!({
            "id": id,
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }));
    }
    Ok(Value::Array(out))
}
