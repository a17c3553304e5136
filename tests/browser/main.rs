//! The chat page (`rustle serve` at `/`, engine/server/page/) in a real browser: headless
//! Chromium driven over WebDriver (`webdriver`), against `rustle serve` on the default
//! model on the CPU. A reply is seen streaming, stopped with the Stop button, and found
//! again after a reload; a reply is regenerated, a message edited, conversations made,
//! switched and deleted; a server with `--api-key` gets its key asked for; the Markdown
//! renderer turns nothing the model writes into markup of its own. Without chromedriver and
//! Chromium every test is reported as ignored, with the reason.
//!
//! `RUSTLE_SCREENSHOT=1` also saves the page as `docs/chat-page.png`, README's picture.

#[path = "../common/mod.rs"]
mod common;
mod markdown;
mod webdriver;

use std::path::Path;
use std::time::{Duration, Instant};

use libtest_mimic::{Arguments, Completion, Trial};
use serde::Deserialize;
use serde_json::json;

use common::server::{MODEL, Server};
use webdriver::{Browser, Tools};

type Test = fn(&Tools);

const TESTS: &[(&str, Test)] = &[
    (
        "page::streams_a_reply_stops_it_and_keeps_it_across_a_reload",
        streams_stops_and_keeps,
    ),
    (
        "page::regenerates_edits_and_keeps_conversations_apart",
        regenerates_edits_and_switches,
    ),
    ("page::asks_for_the_api_key", asks_for_the_api_key),
    (
        "page::markdown_makes_no_markup_of_the_models_text",
        markdown::renders_safely,
    ),
];

/// How long any one thing may take (a reply, a page load) on a busy two-core machine.
const TIMEOUT: Duration = Duration::from_secs(90);

fn main() {
    let mut args = Arguments::from_args();
    // One at a time: streaming is watched as it happens, on a machine of few cores.
    args.test_threads.get_or_insert(1);
    let tools = Tools::find();
    if let Err(why) = &tools {
        eprintln!("browser tests ignored: {why}");
    }
    let trials = TESTS
        .iter()
        .map(|&(name, test)| {
            let tools = tools.clone();
            Trial::ignorable_test(name, move || match tools {
                Err(why) => Ok(Completion::ignored_with(why)),
                Ok(tools) => {
                    test(&tools);
                    Ok(Completion::Completed)
                }
            })
        })
        .collect();
    libtest_mimic::run(&args, trials).exit();
}

/// A message as the page shows it.
#[derive(Clone, Debug, Deserialize, PartialEq)]
struct Message {
    role: String,
    text: String,
    /// How it ended: "stop", "length", "stopped", "error", or "streaming" while it runs.
    finish: String,
    /// What the page says about the ending ("stopped", "cut at max tokens", an error).
    note: String,
}

/// The page open in a browser, on a server of its own.
struct Page {
    browser: Browser,
    server: Server,
}

impl Page {
    fn open(tools: &Tools, server_args: &[&str]) -> Page {
        let server = Server::start(server_args, &[]);
        let browser = Browser::start(tools, 1280, 800);
        browser.goto(&server.url("/"));
        Page { browser, server }
    }

    /// Waits until the page has the model list: it shows the model's name.
    fn wait_connected(&self) {
        wait_for("the model's name on the page", || {
            (self.text("#model-name") == MODEL).then_some(())
        });
    }

    /// The text of the first element matching `selector` ("" when there is none).
    fn text(&self, selector: &str) -> String {
        let script = "return document.querySelector(arguments[0])?.innerText ?? ''";
        let text = self.browser.run(script, json!([selector]));
        text.as_str().unwrap_or_default().to_owned()
    }

    fn messages(&self) -> Vec<Message> {
        let script = "return [...document.querySelectorAll('[data-testid=message]')].map((m) => ({
            role: m.dataset.role,
            finish: m.dataset.finish,
            text: m.querySelector('[data-testid=message-content]')?.innerText ?? '',
            note: m.querySelector('[data-testid=finish]')?.innerText ?? '',
        }))";
        serde_json::from_value(self.browser.run(script, json!([]))).unwrap()
    }

    /// The titles in the sidebar, top first.
    fn conversations(&self) -> Vec<String> {
        let script = "return [...document.querySelectorAll('[data-testid=conversation] .title')]
            .map((b) => b.innerText)";
        serde_json::from_value(self.browser.run(script, json!([]))).unwrap()
    }

    /// Sets the settings through their dialog.
    fn settings(&self, system: &str, temperature: &str, max_tokens: &str) {
        let b = &self.browser;
        b.click("#open-settings");
        b.type_into("#system", system);
        b.type_into("#temperature", temperature);
        b.type_into("#max-tokens", max_tokens);
        b.click("#close-settings");
    }

    fn send(&self, text: &str) {
        self.browser.type_into("#prompt", text);
        self.browser.click("#send");
    }

    /// Waits until the last message is a reply that has ended, and gives the messages then.
    /// A reply that ends in an error fails the test.
    fn wait_reply(&self) -> Vec<Message> {
        let messages = wait_for("the reply to end", || {
            let m = self.messages();
            let last = m.last()?;
            let ended = last.role == "assistant" && !["", "streaming"].contains(&&*last.finish);
            ended.then_some(m)
        });
        let last = messages.last().unwrap();
        assert_ne!(last.finish, "error", "{last:?}\n{}", self.server.log());
        messages
    }

    /// The sum of the series on `/metrics` whose lines begin with `series`.
    fn metric(&self, series: &str) -> f64 {
        let get = async {
            reqwest::get(self.server.url("/metrics"))
                .await?
                .text()
                .await
        };
        let text = webdriver::current_thread().block_on(get).unwrap();
        text.lines()
            .filter(|line| line.starts_with(series))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// Saves the page as docs/chat-page.png when `RUSTLE_SCREENSHOT=1`.
    fn screenshot_if_asked(&self) {
        if std::env::var("RUSTLE_SCREENSHOT").as_deref() != Ok("1") {
            return;
        }
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/chat-page.png");
        std::fs::write(&path, self.browser.screenshot()).unwrap();
        eprintln!("saved {}", path.display());
    }
}

/// Polls `check` until it gives a value; after `TIMEOUT`, fails naming `what`.
fn wait_for<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(start.elapsed() < TIMEOUT, "waited {TIMEOUT:?} for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn roles(messages: &[Message]) -> Vec<&str> {
    messages.iter().map(|m| &*m.role).collect()
}

fn streams_stops_and_keeps(tools: &Tools) {
    let page = Page::open(tools, &[]);
    let b = &page.browser;
    page.wait_connected();
    page.settings("You tell long, detailed stories.", "0", "1000");
    page.send("Tell me a long story about a lighthouse keeper and a storm.");

    // The reply grows while it streams: seen at two lengths before it ends.
    let mut lengths = vec![];
    wait_for("the reply at two lengths while it streams", || {
        let reply = page.messages().pop().filter(|m| m.role == "assistant")?;
        assert_eq!(
            reply.finish, "streaming",
            "ended before two lengths were seen"
        );
        let length = reply.text.chars().count();
        if length > 0 && lengths.last() != Some(&length) {
            lengths.push(length);
        }
        (lengths.len() >= 2).then_some(())
    });
    let aborted =
        format!("rustle_requests_finished_total{{model_name=\"{MODEL}\",finish_reason=\"abort\"");
    let aborts = page.metric(&aborted);
    b.click("#stop");
    let stopped = wait_for("the reply to stop", || {
        let m = page.messages();
        (m.last()?.finish == "stopped").then_some(m)
    });
    let reply = stopped.last().unwrap();
    eprintln!(
        "the reply streamed ({lengths:?} characters seen), stopped at {}",
        reply.text.chars().count()
    );
    assert_eq!(reply.note, "stopped", "the page says so: {reply:?}");
    assert!(reply.text.chars().count() >= lengths[1], "{reply:?}");
    assert!(b.displayed("#send") && !b.displayed("#stop"));
    // Closing the stream ended the request on the server, long before 1000 tokens.
    wait_for("the server to abort the request", || {
        (page.metric(&aborted) > aborts).then_some(())
    });
    let generated = page.metric("rustle_generation_tokens_total");
    assert!(generated < 1000.0, "{generated} tokens generated");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(page.messages(), stopped, "nothing came after Stop");

    b.refresh();
    page.wait_connected();
    assert_eq!(page.messages(), stopped, "the conversation is kept");
    assert_eq!(
        page.conversations(),
        ["Tell me a long story about a lighthouse…"]
    );
    let settings = b.run(
        "return JSON.parse(localStorage.getItem('rustle.settings'))",
        json!([]),
    );
    assert_eq!(
        (&settings["temperature"], &settings["max_tokens"]),
        (&json!(0), &json!(1000)),
        "{settings}"
    );
}

fn regenerates_edits_and_switches(tools: &Tools) {
    let page = Page::open(tools, &[]);
    let b = &page.browser;
    page.wait_connected();
    page.settings("", "0", "48");
    page.send("What is the capital of France?");
    let first = page.wait_reply();
    assert_eq!(roles(&first), ["user", "assistant"]);

    // Regenerate: the reply replaced by a new request's (greedy: the same text).
    let finished = "rustle_requests_finished_total";
    let requests = page.metric(finished);
    b.click("#regenerate");
    wait_for("the regenerated reply's request", || {
        (page.metric(finished) > requests).then_some(())
    });
    assert_eq!(page.wait_reply(), first);

    // Edit the first message: what came after it goes, and the new text is answered.
    page.send("And of Germany?");
    assert_eq!(page.wait_reply().len(), 4);
    b.click("[data-testid=edit]");
    b.type_into("[data-testid=edit-input]", "What is the capital of Italy?");
    b.click("[data-testid=edit-send]");
    let edited = page.wait_reply();
    assert_eq!(roles(&edited), ["user", "assistant"]);
    assert_eq!(edited[0].text, "What is the capital of Italy?");

    // A second conversation; each keeps its own messages.
    b.click("#new-chat");
    assert!(page.messages().is_empty());
    page.settings("", "0", "160");
    page.send("Write a Python function that reverses a string.");
    let code = page.wait_reply();
    let titles = [
        "Write a Python function that reverses a…",
        "What is the capital of Italy?",
    ];
    assert_eq!(page.conversations(), titles);
    b.click("[data-testid=conversation]:nth-child(2) .title");
    assert_eq!(page.messages(), edited);
    b.click("[data-testid=conversation]:nth-child(1) .title");
    assert_eq!(page.messages(), code);
    page.screenshot_if_asked();

    b.click("[data-testid=conversation]:nth-child(2) [data-testid=delete-conversation]");
    assert_eq!(page.conversations(), titles[..1]);
    b.refresh();
    page.wait_connected();
    assert_eq!(page.conversations(), titles[..1]);
    assert_eq!(page.messages(), code);
}

fn asks_for_the_api_key(tools: &Tools) {
    let page = Page::open(tools, &["--api-key", "sekret"]);
    let b = &page.browser;
    wait_for("the key dialog", || {
        b.displayed("#key-dialog").then_some(())
    });
    b.type_into("#key-input", "wrong");
    b.click("#key-submit");
    wait_for("the wrong key refused", || {
        let refused = page.text("#key-error").contains("refused");
        (refused && b.displayed("#key-dialog")).then_some(())
    });
    b.type_into("#key-input", "sekret");
    b.click("#key-submit");
    page.wait_connected();
    assert!(!b.displayed("#key-dialog"));

    // Kept in the browser: after a reload nothing is asked, and chat requests carry it.
    b.refresh();
    page.wait_connected();
    assert!(!b.displayed("#key-dialog"));
    page.settings("", "0", "8");
    page.send("Hello!");
    let reply = page.wait_reply();
    assert!(["stop", "length"].contains(&&*reply[1].finish), "{reply:?}");
}
