use super::*;

fn chat(body: Value) -> Result<Plan, ApiError> {
    parse(Endpoint::Chat, body.to_string().as_bytes(), "m")
}

fn completions(body: Value) -> Result<Plan, ApiError> {
    parse(Endpoint::Completions, body.to_string().as_bytes(), "m")
}

fn param(r: Result<Plan, ApiError>) -> String {
    let e = r.unwrap_err();
    assert_eq!(e.status, 400, "{e:?}");
    e.param.unwrap_or_default()
}

const HI: &str = r#"[{"role": "user", "content": "hi"}]"#;

fn hi() -> Value {
    serde_json::from_str(HI).unwrap()
}

#[test]
fn a_full_chat_request_becomes_a_plan() {
    let p = chat(json!({
        "model": "m", "messages": [
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], "name": "x"}],
        "stream": true, "stream_options": {"include_usage": true},
        "max_tokens": 5, "max_completion_tokens": 7, "temperature": 0.5, "top_p": 0.9,
        "n": 2, "seed": 3, "stop": "\n", "logprobs": true, "top_logprobs": 2,
        "presence_penalty": 0.1, "frequency_penalty": 0.2, "top_k": -1, "min_p": 0.05,
        "repetition_penalty": 1.1, "user": "u", "logit_bias": {}, "tool_choice": "none",
        "response_format": {"type": "text"}, "tools": null,
    }))
    .unwrap();
    let Input::Messages(m) = &p.input else {
        panic!("{:?}", p.input)
    };
    let m: Vec<_> = m
        .iter()
        .map(|m| (m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
        .collect();
    assert_eq!(m, [("system", "be brief"), ("user", "ab")]);
    assert!(p.stream && p.include_usage && p.seeded);
    assert_eq!((p.max_tokens, p.n, p.logprobs), (Some(7), 2, Some(2)));
    assert_eq!(p.stop, ["\n"]);
    assert_eq!(
        (p.sampling.temperature, p.sampling.top_k, p.sampling.seed),
        (0.5, 0, 3)
    );
    // defaults: temperature 1, chat max_tokens open, completions 16
    let p = chat(json!({"model": "m", "messages": hi()})).unwrap();
    assert_eq!(
        (p.sampling.temperature, p.max_tokens, p.logprobs),
        (1.0, None, None)
    );
    let p = completions(json!({"model": "m", "prompt": [[1, 2, 3]], "logprobs": 2})).unwrap();
    assert!(matches!(&p.input, Input::Tokens(t) if t == &[1, 2, 3]));
    assert_eq!((p.max_tokens, p.logprobs), (Some(16), Some(2)));
}

#[test]
fn malformed_missing_and_mistyped_are_400s_that_name_the_field() {
    let e = parse(Endpoint::Chat, b"{\"model\": ", "m").unwrap_err();
    assert!(e.message.contains("not valid JSON"), "{e:?}");
    assert_eq!(param(chat(json!({"messages": hi()}))), "model");
    assert_eq!(param(chat(json!({"model": "m"}))), "messages");
    assert_eq!(param(completions(json!({"model": "m"}))), "prompt");
    assert_eq!(
        param(chat(
            json!({"model": "m", "messages": hi(), "temperature": "hot"})
        )),
        "temperature"
    );
    assert_eq!(
        param(chat(json!({"model": "m", "messages": hi(), "n": 1.5}))),
        "n"
    );
    assert_eq!(
        param(chat(json!({"model": "m", "messages": hi(), "stop": 3}))),
        "stop"
    );
    assert_eq!(
        param(chat(json!({"model": "m", "messages": "hi"}))),
        "messages"
    );
    assert_eq!(
        param(chat(json!({"model": "m", "messages": [{"content": "x"}]}))),
        "messages[0].role"
    );
    assert_eq!(
        param(chat(json!({"model": "other", "messages": hi()}))),
        "model"
    );
    assert_eq!(
        param(completions(json!({"model": "m", "prompt": ["a", "b"]}))),
        "prompt"
    );
    assert_eq!(
        param(completions(json!({"model": "m", "prompt": [1, -2]}))),
        "prompt"
    );
}

#[test]
fn out_of_range_values_are_refused() {
    for (field, value) in [
        ("temperature", json!(2.5)),
        ("top_p", json!(0)),
        ("n", json!(0)),
        ("n", json!(MAX_N + 1)),
        ("max_tokens", json!(0)),
        ("presence_penalty", json!(3)),
        ("frequency_penalty", json!(-2.5)),
        ("min_p", json!(1.5)),
        ("repetition_penalty", json!(0)),
        ("top_k", json!(-2)),
        ("top_logprobs", json!(21)),
        ("stop", json!(["a", "b", "c", "d", "e"])),
        ("stop", json!("")),
    ] {
        let mut body = json!({"model": "m", "messages": hi(), "logprobs": true});
        body[field] = value;
        assert_eq!(param(chat(body)), field);
    }
    assert_eq!(
        param(chat(
            json!({"model": "m", "messages": hi(), "top_logprobs": 2})
        )),
        "top_logprobs"
    );
    assert_eq!(
        param(chat(
            json!({"model": "m", "messages": hi(), "stream_options": {"include_usage": true}})
        )),
        "stream_options"
    );
    assert_eq!(
        param(completions(
            json!({"model": "m", "prompt": "x", "logprobs": 21})
        )),
        "logprobs"
    );
    assert_eq!(
        param(completions(
            json!({"model": "m", "prompt": "x", "logprobs": true})
        )),
        "logprobs"
    );
}

#[test]
fn unsupported_parameters_are_refused_by_name_never_ignored() {
    for (field, value) in [
        ("tools", json!("a tool")),
        ("functions", json!([])),
        ("tool_choice", json!("auto")),
        ("response_format", json!({"type": "json_schema"})),
        ("logit_bias", json!({"50256": -100})),
        ("audio", json!({"voice": "alloy"})),
        ("modalities", json!(["text", "audio"])),
        ("store", json!(true)),
        ("frobnicate", json!(1)),
        ("prompt", json!("chat takes no prompt")),
    ] {
        let mut body = json!({"model": "m", "messages": hi()});
        body[field] = value;
        let e = chat(body).unwrap_err();
        assert_eq!(e.param.as_deref(), Some(field), "{e:?}");
        assert!(e.message.contains(field), "{e:?}");
    }
    assert_eq!(
        param(completions(
            json!({"model": "m", "prompt": "x", "echo": true})
        )),
        "echo"
    );
    assert_eq!(
        param(completions(
            json!({"model": "m", "prompt": "x", "suffix": "y"})
        )),
        "suffix"
    );
    assert_eq!(
        param(completions(
            json!({"model": "m", "prompt": "x", "best_of": 3})
        )),
        "best_of"
    );
    let tool_msg = json!([{"role": "tool", "content": "x"}]);
    assert_eq!(
        param(chat(json!({"model": "m", "messages": tool_msg}))),
        "messages[0].tool_call_id"
    );
    let bad_call = json!([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{x"}}]}]);
    assert_eq!(
        param(chat(json!({"model": "m", "messages": bad_call}))),
        "messages[0].tool_calls"
    );
    let fn_msg = json!([{"role": "function", "content": "x"}]);
    assert_eq!(
        param(chat(json!({"model": "m", "messages": fn_msg}))),
        "messages[0].role"
    );
    let image =
        json!([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]);
    assert_eq!(
        param(chat(json!({"model": "m", "messages": image}))),
        "messages[0].content[0]"
    );
}

#[test]
fn logprobs_shapes() {
    let t = [TokenLogprob {
        token: "Hi".into(),
        logprob: -0.5,
        top: vec![("Hi".into(), -0.5), ("Yo".into(), f32::NEG_INFINITY)],
    }];
    let c = chat_logprobs(&t);
    assert_eq!(c["content"][0]["bytes"], json!([72, 105]));
    assert_eq!(
        c["content"][0]["top_logprobs"][1]["logprob"],
        json!(-9999.0)
    );
    let c = completion_logprobs(&t, 4);
    assert_eq!(c["text_offset"], json!([4]));
    assert_eq!(c["top_logprobs"][0]["Yo"], json!(-9999.0));
    assert_eq!(c["token_logprobs"], json!([-0.5]));
}

#[test]
fn tool_messages_reach_the_template_with_their_arguments_as_values() {
    let messages = json!([
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]);
    let tools = json!([{"type": "function", "function": {"name": "get_weather"}}]);
    let p = chat(
        json!({"model": "m", "messages": messages, "tools": tools, "tool_choice": "required"}),
    )
    .unwrap();
    let Input::Messages(m) = &p.input else {
        panic!("{:?}", p.input)
    };
    assert_eq!(
        m[1]["tool_calls"][0]["function"]["arguments"]["city"],
        "Oslo"
    );
    assert_eq!(m[1]["content"], "");
    assert_eq!(m[2]["tool_call_id"], "call_1");
    assert!(p.tools.is_some_and(|t| t.grammar_needed()));
    let with_format = json!({"model": "m", "messages": [{"role": "user", "content": "x"}],
        "tools": tools, "tool_choice": "required", "response_format": {"type": "json_object"}});
    assert_eq!(param(chat(with_format)), "response_format");
}
