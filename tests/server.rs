//! `rustle serve` as a client meets it: the real binary on a free loopback port, the default
//! model on the CPU, driven over HTTP. Generations are kept short so the file runs in about
//! a minute on two cores.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reqwest::{Client, StatusCode};
use serde_json::{Value, json};

use common::server::{MODEL, Server};

async fn post(c: &Client, s: &Server, path: &str, body: &Value) -> (StatusCode, Value) {
    let r = c.post(s.url(path)).json(body).send().await.unwrap();
    let status = r.status();
    (status, r.json().await.unwrap())
}

/// The `data:` payloads of a server-sent event stream, read to its end.
async fn events(r: reqwest::Response) -> Vec<String> {
    let text = r.text().await.unwrap();
    text.split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .map(str::to_owned)
        .collect()
}

/// `body` posted to `path`, and its stream's `data:` payloads.
async fn stream(c: &Client, s: &Server, path: &str, body: &Value) -> Vec<String> {
    events(c.post(s.url(path)).json(body).send().await.unwrap()).await
}

/// The value of one series on `/metrics` (the first line naming it).
async fn metric(c: &Client, s: &Server, name: &str) -> f64 {
    let text = c
        .get(s.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let line = text
        .lines()
        .find(|l| {
            l.starts_with(&format!("{name}{{"))
                || l.starts_with(&format!("{name} "))
                || (name.ends_with('}') && l.starts_with(name))
        })
        .unwrap_or_else(|| panic!("{name} missing from /metrics:\n{text}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

/// Waits until `/metrics` shows `name` at `want`.
async fn wait_for(c: &Client, s: &Server, name: &str, want: impl Fn(f64) -> bool) {
    let start = Instant::now();
    loop {
        let v = metric(c, s, name).await;
        if want(v) {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{name} stuck at {v}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn chat(content: &str, extra: Value) -> Value {
    let mut body = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "temperature": 0,
        "max_tokens": 16,
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

fn completion(prompt: &str, extra: Value) -> Value {
    let mut body = json!({"model": MODEL, "prompt": prompt, "temperature": 0, "max_tokens": 16});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// An error reply: its status, and the OpenAI error object with all four fields.
fn error_of(status: StatusCode, body: &Value, want: StatusCode) -> &Value {
    assert_eq!(status, want, "{body}");
    let e = &body["error"];
    for field in ["message", "type", "param", "code"] {
        assert!(e.get(field).is_some(), "{field} missing: {body}");
    }
    assert!(
        e["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    e
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn serves_openai_requests() {
    let s = Server::start(&[], &[]);
    let c = Client::new();

    // /health, /v1/models
    let health = c.get(s.url("/health")).send().await.unwrap();
    assert_eq!(health.status(), 200);
    let models: Value = c
        .get(s.url("/v1/models"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["id"], MODEL, "{models}");
    assert_eq!(models["object"], "list");
    chat_page(&c, &s).await;

    let t = Instant::now();
    greedy_stream_and_reply_agree(&c, &s).await;
    eprintln!(
        "greedy stream and reply: {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let t = Instant::now();
    speculation(&c, &s).await;
    eprintln!("speculation: {:.1} s", t.elapsed().as_secs_f64());
    let t = Instant::now();
    stop_strings(&c, &s).await;
    eprintln!("stop strings: {:.1} s", t.elapsed().as_secs_f64());
    let t = Instant::now();
    n_choices_share_the_prompt(&c, &s).await;
    eprintln!("n choices: {:.1} s", t.elapsed().as_secs_f64());
    let t = Instant::now();
    logprobs(&c, &s).await;
    eprintln!("logprobs: {:.1} s", t.elapsed().as_secs_f64());
    let t = Instant::now();
    bad_requests(&c, &s).await;
    eprintln!("bad requests: {:.1} s", t.elapsed().as_secs_f64());
    let t = Instant::now();
    disconnects(&c, &s).await;
    eprintln!(
        "64 clients, half leaving: {:.1} s",
        t.elapsed().as_secs_f64()
    );

    // SIGTERM: a graceful stop.
    let pid = s.child.id().to_string();
    let mut s = s;
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let start = Instant::now();
    let status = loop {
        if let Some(st) = s.child.try_wait().unwrap() {
            break st;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{}", s.log());
    assert!(s.log().contains("rustle serve: stopped"), "{}", s.log());
}

/// The chat page at `/` and every file it loads: the stylesheet and script it names, and
/// each module those scripts import, each with its content type. (tests/browser/ runs it.)
async fn chat_page(c: &Client, s: &Server) {
    let get = |path: String| async move {
        let r = c.get(s.url(&path)).send().await.unwrap();
        assert_eq!(r.status(), 200, "GET {path}");
        let headers = r.headers().clone();
        (headers, r.text().await.unwrap())
    };
    let (headers, html) = get("/".into()).await;
    assert_eq!(headers["content-type"], "text/html; charset=utf-8");
    assert!(
        headers.contains_key("content-security-policy"),
        "{headers:?}"
    );
    assert!(html.contains("<title>rustle</title>"), "{html}");
    // Paths in `src="/page/..."`, `href="/page/..."` and `from "./....js"`.
    let named = |text: &str, before: &str, prefix: &str| -> Vec<String> {
        text.split(before)
            .skip(1)
            .filter_map(|rest| rest.split('"').next())
            .filter_map(|path| path.strip_prefix(prefix))
            .map(|file| format!("/page/{file}"))
            .collect()
    };
    let mut files = named(&html, "src=\"", "/page/");
    files.extend(named(&html, "href=\"", "/page/"));
    assert_eq!(files.len(), 2, "one script and one stylesheet: {files:?}");
    let mut seen = vec![];
    while let Some(path) = files.pop() {
        if seen.contains(&path) {
            continue;
        }
        let (headers, body) = get(path.clone()).await;
        let want = match path.rsplit('.').next() {
            Some("css") => "text/css; charset=utf-8",
            _ => "text/javascript; charset=utf-8",
        };
        assert_eq!(headers["content-type"], want, "{path}");
        files.extend(named(&body, "from \"", "./"));
        seen.push(path);
    }
    assert!(seen.len() >= 5, "the page's files: {seen:?}");
}

async fn greedy_stream_and_reply_agree(c: &Client, s: &Server) {
    let q = "What is the capital of France? Answer in one word.";
    let (status, reply) = post(c, s, "/v1/chat/completions", &chat(q, json!({}))).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["object"], "chat.completion");
    let choice = &reply["choices"][0];
    let text = choice["message"]["content"].as_str().unwrap().to_string();
    assert!(text.contains("Paris"), "{reply}");
    assert_eq!(choice["message"]["role"], "assistant");
    assert!(["stop", "length"].contains(&choice["finish_reason"].as_str().unwrap()));
    let usage = &reply["usage"];
    let (p, g) = (
        usage["prompt_tokens"].as_u64().unwrap(),
        usage["completion_tokens"].as_u64().unwrap(),
    );
    assert!(p > 10 && g > 0 && g <= 16, "{usage}");
    assert_eq!(usage["total_tokens"].as_u64().unwrap(), p + g);

    let body = chat(
        q,
        json!({"stream": true, "stream_options": {"include_usage": true}}),
    );
    let r = c
        .post(s.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let data = events(r).await;
    assert_eq!(data.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let mut streamed = String::new();
    let mut finish = None;
    for ch in &chunks[..chunks.len() - 1] {
        assert_eq!(ch["object"], "chat.completion.chunk");
        assert!(ch["usage"].is_null(), "{ch}");
        let choice = &ch["choices"][0];
        streamed += choice["delta"]["content"].as_str().unwrap_or("");
        if let Some(f) = choice["finish_reason"].as_str() {
            finish = Some(f.to_string());
        }
    }
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(streamed, text, "streaming and not must agree under greedy");
    assert_eq!(finish.as_deref(), choice["finish_reason"].as_str());
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(&last["usage"], usage);
}

/// A request's `speculate` (prompt lookup) changes none of its greedy tokens, streamed or
/// not, and several such requests at once each get their own; the server runs the CPU in the
/// batch-invariant mode, so the guessed rows choose as decode steps do. On a GPU rows computed
/// together may part at a near-tie (tests/gpu/speculation.rs measures them): there the replies
/// are held to their length and shape only.
async fn speculation(c: &Client, s: &Server) {
    let on_cpu = s.log().contains(" on cpu (");
    assert!(on_cpu || s.log().contains(" on NVIDIA"), "{}", s.log());
    let q = "Repeat this sentence exactly: the red fox ran over the green hill to the river.";
    let body = |speculate: u64| chat(q, json!({"max_tokens": 32, "speculate": speculate}));
    let (status, plain) = post(c, s, "/v1/chat/completions", &body(0)).await;
    assert_eq!(status, 200, "{plain}");
    let text = &plain["choices"][0]["message"]["content"];
    let replies = futures_util::future::join_all((0..4).map(|_| {
        let body = body(8);
        async move { post(c, s, "/v1/chat/completions", &body).await }
    }))
    .await;
    for (status, r) in replies {
        assert_eq!(status, 200, "{r}");
        assert!(r["choices"][0]["message"]["content"].is_string(), "{r}");
        if on_cpu {
            assert_eq!(&r["choices"][0]["message"]["content"], text);
            assert_eq!(r["usage"], plain["usage"]);
        }
    }
    let mut streamed = body(8);
    streamed["stream"] = json!(true);
    let data = stream(c, s, "/v1/chat/completions", &streamed).await;
    let streamed: String = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str::<Value>(d).unwrap())
        .filter_map(|ch| {
            ch["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    if on_cpu {
        assert_eq!(streamed, text.as_str().unwrap());
    }
    assert_eq!(data.last().unwrap(), "[DONE]");
}

async fn stop_strings(c: &Client, s: &Server) {
    let prompt = "The capital of France is";
    let body = completion(prompt, json!({"max_tokens": 12, "ignore_eos": true}));
    let (status, free) = post(c, s, "/v1/completions", &body).await;
    assert_eq!(status, 200, "{free}");
    assert_eq!(free["object"], "text_completion");
    let text = free["choices"][0]["text"].as_str().unwrap().to_string();
    assert_eq!(free["choices"][0]["finish_reason"], "length");
    // A stop string from the middle of that text: the reply ends just before it.
    let from = text.char_indices().nth(4).map(|(i, _)| i).unwrap();
    let stop: String = text[from..].chars().take(3).collect();
    let want = &text[..text.find(&stop).unwrap()];
    let body = completion(
        prompt,
        json!({"max_tokens": 12, "ignore_eos": true, "stop": [stop, "zzzz"]}),
    );
    let (status, stopped) = post(c, s, "/v1/completions", &body).await;
    assert_eq!(status, 200, "{stopped}");
    assert_eq!(
        stopped["choices"][0]["text"], want,
        "stop {stop:?} in {text:?}"
    );
    assert_eq!(stopped["choices"][0]["finish_reason"], "stop");
    // Streamed: the same text, and no chunk ever holds the stop string.
    let mut body = body;
    body["stream"] = json!(true);
    let data = stream(c, s, "/v1/completions", &body).await;
    let mut streamed = String::new();
    for d in &data[..data.len() - 1] {
        let ch: Value = serde_json::from_str(d).unwrap();
        let piece = ch["choices"][0]["text"].as_str().unwrap();
        assert!(!piece.contains(&stop), "{piece:?} holds {stop:?}");
        streamed += piece;
    }
    assert_eq!(streamed, want);
    // The stopped request was aborted: nothing left running.
    wait_for(c, s, "rustle_requests_running", |v| v == 0.0).await;
}

async fn n_choices_share_the_prompt(c: &Client, s: &Server) {
    // A long prompt of its own: its second choice takes every full block from the first.
    let words: Vec<String> = (0..60).map(|i| format!("w{}", i * 7919 % 1000)).collect();
    let q = format!(
        "nonce {}: repeat these words: {}",
        std::process::id(),
        words.join(" ")
    );
    let before = metric(c, s, "rustle_prefix_cache_hit_tokens_total").await;
    let body = chat(
        &q,
        json!({"n": 2, "temperature": 0.8, "seed": 1, "max_tokens": 8}),
    );
    let (status, reply) = post(c, s, "/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{reply}");
    let choices = reply["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 2);
    assert_eq!(
        (choices[0]["index"].as_u64(), choices[1]["index"].as_u64()),
        (Some(0), Some(1))
    );
    let prompt = reply["usage"]["prompt_tokens"].as_u64().unwrap();
    let hits = metric(c, s, "rustle_prefix_cache_hit_tokens_total").await - before;
    let shared = (prompt - 1) / 16 * 16;
    assert!(
        prompt > 100 && hits >= shared as f64,
        "{hits} hit tokens, prompt {prompt}"
    );
    // A seeded request repeats.
    let (_, again) = post(c, s, "/v1/chat/completions", &body).await;
    assert_eq!(again["choices"], reply["choices"]);
}

async fn logprobs(c: &Client, s: &Server) {
    let body = chat(
        "Name a colour.",
        json!({"logprobs": true, "top_logprobs": 3, "max_tokens": 6}),
    );
    let (status, reply) = post(c, s, "/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{reply}");
    let content = reply["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap();
    assert_eq!(
        content.len() as u64,
        reply["usage"]["completion_tokens"].as_u64().unwrap()
    );
    let mut text = String::new();
    for t in content {
        let top = t["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3, "{t}");
        // Greedy: the chosen token is the most likely one.
        assert_eq!(top[0]["token"], t["token"], "{t}");
        assert!(t["logprob"].as_f64().unwrap() <= 0.0);
        assert!(t["bytes"].is_array());
        text += t["token"].as_str().unwrap();
    }
    assert_eq!(reply["choices"][0]["message"]["content"], text.as_str());
    let body = completion("Once upon a time", json!({"logprobs": 2, "max_tokens": 4}));
    let (status, reply) = post(c, s, "/v1/completions", &body).await;
    assert_eq!(status, 200, "{reply}");
    let lp = &reply["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), 4, "{lp}");
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), 4);
    assert!(
        lp["top_logprobs"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t.as_object().unwrap().len() == 2)
    );
}

async fn bad_requests(c: &Client, s: &Server) {
    let chat_url = s.url("/v1/chat/completions");
    // Malformed JSON
    let r = c.post(&chat_url).body("{\"model\": ").send().await.unwrap();
    let status = r.status();
    let body: Value = r.json().await.unwrap();
    let e = error_of(status, &body, StatusCode::BAD_REQUEST);
    assert_eq!(e["type"], "invalid_request_error");
    let cases = [
        // missing field, wrong type, unknown model, out of range, unsupported
        (json!({"model": MODEL}), "messages"),
        (chat("hi", json!({"max_tokens": "many"})), "max_tokens"),
        (chat("hi", json!({"model": "gpt-4o"})), "model"),
        (chat("hi", json!({"temperature": 3})), "temperature"),
        (chat("hi", json!({"top_p": 0})), "top_p"),
        (chat("hi", json!({"n": 0})), "n"),
        (chat("hi", json!({"speculate": 65})), "speculate"),
        (
            chat("hi", json!({"presence_penalty": -3})),
            "presence_penalty",
        ),
        (
            chat("hi", json!({"stop": ["a", "b", "c", "d", "e"]})),
            "stop",
        ),
        (
            chat(
                "hi",
                json!({"tools": [{"type": "function", "function": {"name": "f"}}]}),
            ),
            "tools",
        ),
        (
            chat("hi", json!({"response_format": {"type": "xml"}})),
            "response_format",
        ),
        (chat("hi", json!({"logit_bias": {"42": 10}})), "logit_bias"),
        (chat("hi", json!({"frobnicate": true})), "frobnicate"),
        // prompt + max_tokens past the context (8192)
        (chat("hi", json!({"max_tokens": 9000})), "max_tokens"),
    ];
    for (body, param) in cases {
        let (status, reply) = post(c, s, "/v1/chat/completions", &body).await;
        let e = error_of(status, &reply, StatusCode::BAD_REQUEST);
        assert_eq!(e["param"], param, "{reply}");
        assert_eq!(e["type"], "invalid_request_error");
    }
    let (status, reply) = post(
        c,
        s,
        "/v1/chat/completions",
        &chat("hi", json!({"model": "gpt-4o"})),
    )
    .await;
    assert_eq!(
        error_of(status, &reply, StatusCode::BAD_REQUEST)["code"],
        "model_not_found"
    );
    let (status, reply) = post(
        c,
        s,
        "/v1/chat/completions",
        &chat("hi", json!({"max_tokens": 9000})),
    )
    .await;
    assert_eq!(
        error_of(status, &reply, StatusCode::BAD_REQUEST)["code"],
        "context_length_exceeded"
    );
    let long = "word ".repeat(9000);
    let (status, reply) = post(c, s, "/v1/completions", &completion(&long, json!({}))).await;
    let e = error_of(status, &reply, StatusCode::BAD_REQUEST);
    assert_eq!(
        (&e["param"], &e["code"]),
        (&json!("prompt"), &json!("context_length_exceeded"))
    );
    let r = c.get(s.url("/v1/nothing")).send().await.unwrap();
    let status = r.status();
    error_of(status, &r.json().await.unwrap(), StatusCode::NOT_FOUND);
    // None of it disturbed the server.
    let (status, _) = post(
        c,
        s,
        "/v1/completions",
        &completion("Hello", json!({"max_tokens": 2})),
    )
    .await;
    assert_eq!(status, 200);
}

/// 64 streaming clients at once; half leave at random points (before the first event,
/// mid-stream). Afterwards every KV block is free and nothing runs.
async fn disconnects(c: &Client, s: &Server) {
    let aborted_before = aborts(c, s).await;
    let mut rng = StdRng::seed_from_u64(12);
    let mut clients = vec![];
    for i in 0..64 {
        let leave_after = rng.random_bool(0.5).then(|| rng.random_range(0..5usize));
        let body = completion(
            &format!("Story number {i}: once upon a time"),
            json!({"stream": true, "max_tokens": 10, "ignore_eos": true}),
        );
        let (c, url) = (c.clone(), s.url("/v1/completions"));
        clients.push(tokio::spawn(async move {
            let mut r = c.post(url).json(&body).send().await.unwrap();
            assert_eq!(r.status(), 200);
            let mut seen = String::new();
            let mut chunks = 0;
            loop {
                if leave_after == Some(chunks) {
                    return None; // dropping the response closes the connection
                }
                let Some(bytes) = r.chunk().await.unwrap() else {
                    break;
                };
                seen += std::str::from_utf8(&bytes).unwrap();
                chunks += 1;
            }
            Some(seen)
        }));
    }
    // And clients that give up on a whole reply before it comes.
    let mut impatient = vec![];
    for i in 0..8 {
        let body = completion(
            &format!("Impatient {i}"),
            json!({"max_tokens": 10, "ignore_eos": true}),
        );
        let wait = Duration::from_millis(rng.random_range(10..400));
        let r = c.post(s.url("/v1/completions")).json(&body).timeout(wait);
        impatient.push(tokio::spawn(r.send()));
    }
    for r in impatient {
        if let Ok(r) = r.await.unwrap() {
            assert_eq!(r.status(), 200);
        }
    }
    let mut finished = 0;
    for cl in clients {
        if let Some(seen) = cl.await.unwrap() {
            assert!(seen.ends_with("data: [DONE]\n\n"), "{seen}");
            assert!(seen.contains("\"finish_reason\":\"length\""), "{seen}");
            finished += 1;
        }
    }
    assert!((20..=44).contains(&finished), "{finished} of 64 stayed");
    wait_for(c, s, "rustle_requests_running", |v| v == 0.0).await;
    wait_for(c, s, "rustle_requests_waiting", |v| v == 0.0).await;
    wait_for(c, s, "rustle_kv_blocks_used", |v| v == 0.0).await;
    assert!(metric(c, s, "rustle_kv_blocks_free").await >= 64.0);
    let aborted = aborts(c, s).await - aborted_before;
    assert!(aborted >= 10.0, "only {aborted} requests aborted");
}

/// Requests aborted so far (clients gone, stop strings, time limits).
async fn aborts(c: &Client, s: &Server) -> f64 {
    let series = r#"rustle_requests_finished_total{model_name="SmolLM2-135M-Instruct.Q4_1",finish_reason="abort"}"#;
    metric(c, s, series).await
}

/// `rustle serve --speculate 8`: every request guesses by prompt lookup unless it says
/// otherwise, and today's guarantees hold: greedy streams equal replies, stop strings, `n`
/// choices, log-probabilities (those requests do not speculate), and 64 clients half of whom
/// leave mid-stream give every KV block back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn serves_the_same_with_speculation_on() {
    let s = Server::start(&["--speculate", "8"], &[]);
    let c = Client::new();
    greedy_stream_and_reply_agree(&c, &s).await;
    speculation(&c, &s).await;
    stop_strings(&c, &s).await;
    n_choices_share_the_prompt(&c, &s).await;
    logprobs(&c, &s).await;
    disconnects(&c, &s).await;
}

/// `--api-key` (here from RUSTLE_API_KEY), `--max-queued` and `--request-timeout`, on a
/// server that runs one sequence at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn key_queue_and_timeout() {
    let s = Server::start(
        &[
            "--max-queued",
            "1",
            "--max-seqs",
            "1",
            "--request-timeout",
            "3",
        ],
        &[("RUSTLE_API_KEY", "sekret")],
    );
    let c = Client::new();
    let key = |r: reqwest::RequestBuilder| r.bearer_auth("sekret");

    // 401 without the key or with a wrong one; /health, /metrics and the page stay open.
    for auth in [None, Some("wrong")] {
        let mut r = c.get(s.url("/v1/models"));
        if let Some(k) = auth {
            r = r.bearer_auth(k);
        }
        let r = r.send().await.unwrap();
        let status = r.status();
        let e = error_of(status, &r.json().await.unwrap(), StatusCode::UNAUTHORIZED).clone();
        assert_eq!(e["code"], "invalid_api_key");
    }
    let r = c
        .post(s.url("/v1/completions"))
        .json(&completion("Hi", json!({})))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(
        key(c.get(s.url("/v1/models")))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(c.get(s.url("/health")).send().await.unwrap().status(), 200);
    // The chat page too: it asks for the key itself.
    assert_eq!(c.get(s.url("/")).send().await.unwrap().status(), 200);

    // A long request runs (past the time limit); a second waits; a third is refused.
    let long = completion(
        "Count to a thousand:",
        json!({"max_tokens": 4000, "ignore_eos": true}),
    );
    let hog = tokio::spawn(key(c.post(s.url("/v1/completions")).json(&long)).send());
    wait_for(&c, &s, "rustle_generation_tokens_total", |v| v > 2.0).await;
    let short = completion("Hi", json!({"max_tokens": 2}));
    let waiting = tokio::spawn(key(c.post(s.url("/v1/completions")).json(&short)).send());
    wait_for(&c, &s, "rustle_requests_waiting", |v| v == 1.0).await;
    let r = key(c.post(s.url("/v1/completions")).json(&short))
        .send()
        .await
        .unwrap();
    let status = r.status();
    let retry = r
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_string());
    let e = error_of(
        status,
        &r.json().await.unwrap(),
        StatusCode::TOO_MANY_REQUESTS,
    )
    .clone();
    assert_eq!(e["code"], "rate_limit_exceeded");
    assert_eq!(retry.as_deref(), Some("1"));

    // The long one ends at the limit with a 408.
    let r = hog.await.unwrap().unwrap();
    let status = r.status();
    let e = error_of(
        status,
        &r.json().await.unwrap(),
        StatusCode::REQUEST_TIMEOUT,
    )
    .clone();
    assert_eq!(e["type"], "timeout_error");
    // The one that waited ran then (or reached its own limit first, on a loaded machine:
    // one more timeout in the count below).
    let status = waiting.await.unwrap().unwrap().status();
    assert!([200, 408].contains(&status.as_u16()), "{status}");
    let waiter_timed_out = f64::from(u8::from(status == 408));

    // A stream past the limit ends with an error event, then [DONE].
    let mut body = long.clone();
    body["stream"] = json!(true);
    let r = key(c.post(s.url("/v1/completions")).json(&body))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let data = events(r).await;
    assert_eq!(data.last().unwrap(), "[DONE]");
    let err: Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
    assert_eq!(err["error"]["type"], "timeout_error", "{err}");
    wait_for(&c, &s, "rustle_kv_blocks_used", |v| v == 0.0).await;
    assert_eq!(
        metric(&c, &s, "rustle_requests_timed_out_total").await,
        2.0 + waiter_timed_out
    );
}

/// The official `openai` Python package, in a virtual environment of its own.
#[test]
fn openai_python_client() {
    let dir = std::env::temp_dir().join(format!("rustle-openai-venv-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let venv = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&dir)
        .output();
    match venv {
        Ok(out) if out.status.success() => {}
        Ok(out) => panic!(
            "`python3 -m venv` failed, so the openai client cannot be tested: install python3-venv\n{}",
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => panic!("cannot run python3 ({e}), so the openai client cannot be tested"),
    }
    let pip = Command::new(dir.join("bin/pip"))
        .args([
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "openai",
            "jsonschema",
        ])
        .output()
        .unwrap();
    assert!(
        pip.status.success(),
        "pip install openai failed:\n{}",
        String::from_utf8_lossy(&pip.stderr)
    );
    let s = Server::start(&["--api-key", "test-key"], &[]);
    let tools_model = tiny_with_tools();
    let t = Server::start(
        &[
            "-m",
            tools_model.to_str().unwrap(),
            "--served-model-name",
            "tiny",
        ],
        &[],
    );
    let out = Command::new(dir.join("bin/python"))
        .arg("tests/openai_client.py")
        .args([&s.base, "test-key", MODEL, &t.base, "tiny"])
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "tests/openai_client.py failed:\n{}\n{}\nserver:\n{}\ntools server:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        s.log(),
        t.log()
    );
}

/// The tiny Qwen3 with a chat template that renders tools (tests/data/tools_template.jinja)
/// and a context long enough for the tools' descriptions (its random weights do not care).
fn tiny_with_tools() -> std::path::PathBuf {
    let src = std::path::Path::new("tests/golden/tiny-qwen3");
    let dir = std::env::temp_dir().join(format!("rustle-tools-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for f in [
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let config = std::fs::read_to_string(src.join("config.json")).unwrap();
    let config = config.replace(
        "\"max_position_embeddings\": 256",
        "\"max_position_embeddings\": 4096",
    );
    std::fs::write(dir.join("config.json"), config).unwrap();
    std::fs::copy(
        "tests/data/tools_template.jinja",
        dir.join("chat_template.jinja"),
    )
    .unwrap();
    dir
}

/// A model whose every layer attends over a sliding window (the tiny Mistral's 8 positions)
/// served from a pool too small for its requests' whole contexts: their blocks go back as
/// they fall out of the window, so four requests of 69 positions (5 blocks each) run side by
/// side in 12 blocks without preemption, each with the text it gets alone; clients that
/// leave mid-stream and a bad request beside them change nothing; every block ends free.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_windowed_model_serves_past_its_window_in_a_small_pool() {
    let s = Server::start(
        &[
            "-m",
            "tests/golden/tiny-mistral",
            "--served-model-name",
            "tiny",
            "--kv-blocks",
            "12",
        ],
        &[],
    );
    let c = Client::new();
    let body = |i: usize, extra: Value| {
        let mut b = json!({"model": "tiny", "prompt": format!("Window {i}: the quick brown"),
            "temperature": 0, "max_tokens": 60, "ignore_eos": true});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    let text = |v: &Value| v["choices"][0]["text"].as_str().unwrap().to_owned();
    let mut alone = vec![];
    for i in 0..4 {
        let (status, v) = post(&c, &s, "/v1/completions", &body(i, json!({}))).await;
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["usage"]["completion_tokens"], 60, "{v}");
        alone.push(text(&v));
    }

    let mut together = vec![];
    for i in 0..4 {
        let (c, url, b) = (c.clone(), s.url("/v1/completions"), body(i, json!({})));
        together.push(tokio::spawn(async move {
            let r = c.post(url).json(&b).send().await.unwrap();
            assert_eq!(r.status(), 200);
            r.json::<Value>().await.unwrap()
        }));
    }
    let mut leavers = vec![];
    for i in 4..6 {
        let (c, url, b) = (
            c.clone(),
            s.url("/v1/completions"),
            body(i, json!({"stream": true})),
        );
        leavers.push(tokio::spawn(async move {
            let mut r = c.post(url).json(&b).send().await.unwrap();
            for _ in 0..3 {
                r.chunk().await.unwrap();
            }
            // Dropping the response closes the connection mid-stream.
        }));
    }
    let (status, bad) = post(
        &c,
        &s,
        "/v1/completions",
        &body(9, json!({"max_tokens": -1})),
    )
    .await;
    error_of(status, &bad, StatusCode::BAD_REQUEST);
    for l in leavers {
        l.await.unwrap();
    }
    for (i, t) in together.into_iter().enumerate() {
        let v = t.await.unwrap();
        assert_eq!(text(&v), alone[i], "request {i} side by side against alone");
    }
    wait_for(&c, &s, "rustle_requests_running", |v| v == 0.0).await;
    wait_for(&c, &s, "rustle_kv_blocks_used", |v| v == 0.0).await;
    assert_eq!(metric(&c, &s, "rustle_kv_blocks_free").await, 12.0);
    assert_eq!(
        metric(&c, &s, "rustle_preemptions_total").await,
        0.0,
        "{}",
        s.log()
    );
}
