// A small Markdown renderer for the model's replies, safe by construction: every piece of
// the text is HTML-escaped before any markup is put around it, so nothing the model writes
// becomes a tag or an attribute, and a link keeps only an http(s) or mailto target. It
// covers what chat models write: fenced code blocks, headings, bullet and numbered lists,
// quotes and paragraphs; inline code, bold, italic and links. A fence still open (a reply
// mid-stream) runs to the end of the text.

const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };

export function escapeHtml(text) {
  return text.replace(/[&<>"']/g, (c) => ESCAPES[c]);
}

// Block patterns, tried on each line of the raw text.
const FENCE = /^\s*(```|~~~)\s*([\w+#.-]*)/;
const HEADING = /^\s*(#{1,6})\s+(.*)$/;
const BULLET = /^\s*[-*+]\s+(.*)$/;
const NUMBERED = /^\s*(\d{1,9})[.)]\s+(.*)$/;
const QUOTE = /^\s*>\s?(.*)$/;

// Inline patterns. Emphasis is applied to escaped text, which holds no `*` or `_` that the
// escaping made: `&amp;` and `&#39;` are letters, digits and punctuation of their own.
const CODE_SPAN = /`([^`\n]+)`/g;
const LINK = /\[([^\]\u0000]+)\]\(([^)\s\u0000]+)\)/g;
const SAFE_HREF = /^(https?:\/\/|mailto:)/i;
const BOLD = /(\*\*|__)(?=\S)(.+?)(?<=\S)\1/g;
const ITALIC = /(^|[^\w*])([*_])(?=\S)(.+?)(?<=\S)\2(?![\w*])/g;
// Where a held piece (a code span, a link) waits while emphasis is applied around it.
const HELD = /\u0000(\d+)\u0000/g;

/** `text` (Markdown) as HTML that is safe to put in the page. */
export function renderMarkdown(text) {
  const lines = text
    .replace(/\u0000/g, "")
    .replace(/\r\n?/g, "\n")
    .split("\n");
  const html = [];
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    let m;
    if ((m = line.match(FENCE))) {
      const close = m[1];
      const code = [];
      for (i++; i < lines.length && !lines[i].trim().startsWith(close); i++) code.push(lines[i]);
      i++; // the closing fence, when there is one
      html.push(codeBlock(code.join("\n"), m[2]));
    } else if (!line.trim()) {
      i++;
    } else if ((m = line.match(HEADING))) {
      const level = m[1].length;
      html.push(`<h${level}>${inline(m[2])}</h${level}>`);
      i++;
    } else if (BULLET.test(line)) {
      const items = [];
      for (; i < lines.length && (m = lines[i].match(BULLET)); i++) items.push(m[1]);
      html.push(`<ul>${items.map((t) => `<li>${inline(t)}</li>`).join("")}</ul>`);
    } else if ((m = line.match(NUMBERED))) {
      // A list cut by a code block goes on from its own number, not from 1.
      const start = Number(m[1]);
      const items = [];
      for (; i < lines.length && (m = lines[i].match(NUMBERED)); i++) items.push(m[2]);
      const from = start === 1 ? "" : ` start="${start}"`;
      html.push(`<ol${from}>${items.map((t) => `<li>${inline(t)}</li>`).join("")}</ol>`);
    } else if (QUOTE.test(line)) {
      const quoted = [];
      for (; i < lines.length && (m = lines[i].match(QUOTE)); i++) quoted.push(m[1]);
      html.push(`<blockquote>${renderMarkdown(quoted.join("\n"))}</blockquote>`);
    } else {
      const paragraph = [];
      for (; i < lines.length && lines[i].trim() && !startsBlock(lines[i]); i++) {
        paragraph.push(lines[i]);
      }
      html.push(`<p>${paragraph.map(inline).join("<br>")}</p>`);
    }
  }
  return html.join("\n");
}

function startsBlock(line) {
  return [FENCE, HEADING, BULLET, NUMBERED, QUOTE].some((p) => p.test(line));
}

function codeBlock(code, language) {
  const label = language ? ` data-language="${escapeHtml(language)}"` : "";
  return `<pre${label}><code>${escapeHtml(code)}</code></pre>`;
}

/** One line's inline Markdown as HTML. Code spans and links are rendered first and held
 *  aside, so that emphasis never reaches inside them (an `_` in a URL stays an `_`). */
function inline(text) {
  const held = [];
  const hold = (html) => `\u0000${held.push(html) - 1}\u0000`;
  const rest = text
    .replace(CODE_SPAN, (_, code) => hold(`<code>${escapeHtml(code)}</code>`))
    .replace(LINK, (whole, label, href) => {
      // Any other target (javascript:, data:, a relative path) stays text, as written.
      if (!SAFE_HREF.test(href)) return whole;
      const attributes = `href="${escapeHtml(href)}" target="_blank" rel="noopener noreferrer"`;
      return hold(`<a ${attributes}>${escapeHtml(label)}</a>`);
    });
  return escapeHtml(rest)
    .replace(BOLD, "<strong>$2</strong>")
    .replace(ITALIC, "$1<em>$3</em>")
    .replace(HELD, (_, n) => held[Number(n)]);
}
