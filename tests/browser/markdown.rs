//! The page's Markdown renderer (engine/server/page/markdown.js) run in the browser on text
//! a model could write: what it should make of each, and, put into a page, no element or
//! attribute but those Markdown makes (no script, no event handler, no `javascript:` link).

use serde::Deserialize;
use serde_json::json;

use super::Page;
use super::webdriver::Tools;

/// Markdown, and pieces its HTML must hold.
const CASES: &[(&str, &[&str])] = &[
    (
        "<script>alert(1)</script><img src=x onerror=alert(2)>",
        &["&lt;script&gt;alert(1)&lt;/script&gt;&lt;img src=x onerror=alert(2)&gt;"],
    ),
    (
        "[click](javascript:alert(1))",
        &["<p>[click](javascript:alert(1))</p>"],
    ),
    (
        "see [the docs](https://example.com/a_b_c?x=1&y=2)",
        &[
            r#"<a href="https://example.com/a_b_c?x=1&amp;y=2" target="_blank" rel="noopener noreferrer">the docs</a>"#,
        ],
    ),
    (
        r#"[x](https://e.com/"onmouseover="alert(1))"#,
        &[r#"href="https://e.com/&quot;onmouseover=&quot;alert(1""#],
    ),
    (
        "```rust\nfn main() { println!(\"<hi>\"); }\n```",
        &[
            r#"<pre data-language="rust"><code>fn main() { println!(&quot;&lt;hi&gt;&quot;); }</code></pre>"#,
        ],
    ),
    (
        "```js\" onclick=\"alert(1)\nlet a = 1;\n```",
        &[r#"<pre data-language="js"><code>let a = 1;</code></pre>"#],
    ),
    (
        "**bold**, *italic*, `a<b>` and snake_case_name",
        &["<strong>bold</strong>, <em>italic</em>, <code>a&lt;b&gt;</code> and snake_case_name"],
    ),
    (
        "# Title\n- one\n- two\n\n3. three\n4. four\n> quoted",
        &[
            "<h1>Title</h1>",
            "<ul><li>one</li><li>two</li></ul>",
            r#"<ol start="3"><li>three</li><li>four</li></ol>"#,
            "<blockquote><p>quoted</p></blockquote>",
        ],
    ),
    (
        "Mid-stream:\n```python\nprint(1)",
        &[
            "<p>Mid-stream:</p>",
            r#"<pre data-language="python"><code>print(1)</code></pre>"#,
        ],
    ),
];

#[derive(Debug, Deserialize)]
struct Rendered {
    html: String,
    /// Elements and attributes Markdown does not make, as `TAG` or `TAG name=value`.
    foreign: Vec<String>,
}

/// Renders each text with the page's own module and puts the HTML into a detached element.
const RENDER: &str = r#"
const [texts, done] = arguments;
const tags = /^(P|BR|STRONG|EM|CODE|PRE|UL|OL|LI|H[1-6]|BLOCKQUOTE|A)$/;
const plain = ["target", "rel", "start", "data-language"];
const allowed = (a) => plain.includes(a.name) || (a.name === "href" && /^(https?:|mailto:)/.test(a.value));
import("/page/markdown.js").then(({ renderMarkdown }) => done(texts.map((text) => {
  const html = renderMarkdown(text);
  const box = document.createElement("div");
  box.innerHTML = html;
  const foreign = [...box.querySelectorAll("*")].flatMap((el) => [
    ...(tags.test(el.tagName) ? [] : [el.tagName]),
    ...[...el.attributes].filter((a) => !allowed(a)).map((a) => `${el.tagName} ${a.name}=${a.value}`),
  ]);
  return { html, foreign };
})), (e) => done(String(e)));
"#;

pub fn renders_safely(tools: &Tools) {
    let page = Page::open(tools, &[]);
    let texts: Vec<&str> = CASES.iter().map(|(text, _)| *text).collect();
    let value = page.browser.run_async(RENDER, json!([texts]));
    let rendered: Vec<Rendered> = serde_json::from_value(value.clone())
        .unwrap_or_else(|e| panic!("the renderer did not run: {e}: {value}"));
    assert_eq!(rendered.len(), CASES.len());
    for ((text, pieces), r) in CASES.iter().zip(&rendered) {
        assert!(
            r.foreign.is_empty(),
            "{text:?} made {:?}: {}",
            r.foreign,
            r.html
        );
        for piece in *pieces {
            assert!(
                r.html.contains(piece),
                "{text:?}: want {piece}\nin {}",
                r.html
            );
        }
    }
}
