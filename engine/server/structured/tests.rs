use super::*;

fn weather() -> Value {
    json!({"type": "function", "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    }})
}

#[test]
fn formats_are_read_from_the_template() {
    let qwen = "{% if tools %}<tools>{{ tools }}</tools> ... <tool_call>{% endif %}";
    assert_eq!(ToolFormat::of_template(qwen), Some(ToolFormat::Tagged));
    let llama =
        "{% if tools is not none %}{\"name\": function name, \"parameters\": ...}{% endif %}";
    assert_eq!(ToolFormat::of_template(llama), Some(ToolFormat::Json));
    assert_eq!(ToolFormat::of_template("{{ messages }}"), None);
}

#[test]
fn tagged_calls_parse_with_the_content_before_them() {
    let text = "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"f\", \"arguments\": \"{}\"}\n</tool_call>";
    let (content, calls) = parse_calls(text, ToolFormat::Tagged).unwrap();
    assert_eq!(content, "Let me look.");
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0].name, "get_weather");
    assert_eq!(calls[0].arguments, r#"{"city":"Oslo"}"#);
    assert_eq!(calls[1].arguments, "{}");
    assert!(parse_calls("no calls here", ToolFormat::Tagged).is_none());
    assert!(parse_calls("<tool_call>{not json</tool_call>", ToolFormat::Tagged).is_none());
    let (_, calls) =
        parse_calls(r#"{"name": "f", "parameters": {"x": 1}}"#, ToolFormat::Json).unwrap();
    assert_eq!(calls[0].arguments, r#"{"x":1}"#);
}

#[test]
fn a_stream_sends_content_and_holds_what_may_be_a_call() {
    let mut s = ToolStream::new(ToolFormat::Tagged, &ToolChoice::Auto);
    assert_eq!(s.push("Sure. <tool"), "Sure. ");
    assert_eq!(s.push("_call>\n{\"name\": \"f\", "), "");
    assert_eq!(s.push("\"arguments\": {}}\n</tool_call>"), "");
    let (content, calls) = s.finish();
    assert_eq!((content.as_str(), calls.len()), ("", 1));

    // A held end that never became a tag goes out at the end.
    let mut s = ToolStream::new(ToolFormat::Tagged, &ToolChoice::Auto);
    assert_eq!(s.push("a < b, and <"), "a < b, and ");
    assert_eq!(s.finish(), ("<".to_string(), vec![]));

    // Bare JSON: a reply that opens with text is content to the end.
    let mut s = ToolStream::new(ToolFormat::Json, &ToolChoice::Auto);
    assert_eq!(s.push("  "), "");
    assert_eq!(s.push("Hi {x}"), "  Hi {x}");
    assert_eq!(s.push(" {"), " {");
    let mut s = ToolStream::new(ToolFormat::Json, &ToolChoice::Auto);
    assert_eq!(s.push(" {\"name\": \"f\", \"parameters\": {}}"), "");
    assert_eq!(s.finish().1[0].name, "f");

    // Required: nothing is content until the end.
    let mut s = ToolStream::new(ToolFormat::Tagged, &ToolChoice::Required);
    assert_eq!(s.push("plain"), "");
    assert_eq!(s.finish(), ("plain".to_string(), vec![]));
}

#[test]
fn tools_and_choices_are_checked() {
    let t = tools(Some(json!([weather()])), None).unwrap().unwrap();
    assert_eq!(t.choice, ToolChoice::Auto);
    assert_eq!(
        tools(Some(json!([weather()])), Some(json!("none"))).unwrap(),
        None
    );
    assert_eq!(tools(None, None).unwrap(), None);
    let named = json!({"type": "function", "function": {"name": "get_weather"}});
    let t = tools(Some(json!([weather()])), Some(named))
        .unwrap()
        .unwrap();
    assert_eq!(t.choice, ToolChoice::Named("get_weather".into()));
    let err = |tl: Value, c: Option<Value>| tools(Some(tl), c).unwrap_err().body().to_string();
    assert!(err(json!([weather()]), Some(json!("sometimes"))).contains("'sometimes'"));
    let other = json!({"type": "function", "function": {"name": "nope"}});
    assert!(err(json!([weather()]), Some(other)).contains("'nope' is not among"));
    assert!(
        err(
            json!([{"type": "function", "function": {"name": "a b"}}]),
            None
        )
        .contains("tools[0].function.name")
    );
    assert!(err(json!([{"type": "retrieval"}]), None).contains("tools[0]"));
    assert!(
        tools(None, Some(json!("required")))
            .unwrap_err()
            .body()
            .to_string()
            .contains("needs 'tools'")
    );
}

#[test]
fn response_formats_become_grammars() {
    let f = |v: Value| response_format(Some(v.as_object().unwrap().clone()));
    assert_eq!(f(json!({"type": "text"})).unwrap(), None);
    assert_eq!(
        f(json!({"type": "json_object"})).unwrap(),
        Some(GrammarSpec::JsonObject)
    );
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
    assert_eq!(
        f(json!({"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": true}}))
            .unwrap(),
        Some(GrammarSpec::JsonSchema(schema))
    );
    for bad in [
        json!({"type": "xml"}),
        json!({"type": "json_schema"}),
        json!({"type": "json_schema", "json_schema": {"schema": {}}}),
        json!({"type": "json_schema", "json_schema": {"name": "x", "schema": 3}}),
    ] {
        let e = f(bad.clone()).unwrap_err().body().to_string();
        assert!(e.contains("response_format"), "{bad}: {e}");
    }
}

#[test]
fn the_grammar_of_required_calls_names_every_function() {
    let other = json!({"type": "function", "function": {"name": "other"}});
    let t = tools(Some(json!([weather(), other])), Some(json!("required")))
        .unwrap()
        .unwrap();
    let Some(GrammarSpec::Lark(g)) = t.grammar(ToolFormat::Tagged) else {
        panic!()
    };
    assert!(
        g.contains("get_weather") && g.contains("\"other\"") && g.contains("<tool_call>"),
        "{g}"
    );
    let Some(GrammarSpec::Lark(g)) = t.grammar(ToolFormat::Json) else {
        panic!()
    };
    assert!(
        g.contains("\"parameters\"") && !g.contains("<tool_call>"),
        "{g}"
    );
    let auto = tools(Some(json!([weather()])), None).unwrap().unwrap();
    assert_eq!(auto.grammar(ToolFormat::Tagged), None);
}
