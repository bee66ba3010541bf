// Markdown rendering of answers. Model output is untrusted: raw HTML in it is shown as text
// (marked's `html` tokens are escaped), and the rendered HTML is sanitized by DOMPurify
// (no scripts, event handlers, styles, frames, forms or images — the page loads nothing
// from elsewhere). Code blocks are highlighted by highlight.js's core with a few languages.

import DOMPurify from "dompurify";
import { Marked } from "marked";
import hljs from "highlight.js/lib/core";
import bash from "highlight.js/lib/languages/bash";
import c from "highlight.js/lib/languages/c";
import cpp from "highlight.js/lib/languages/cpp";
import css from "highlight.js/lib/languages/css";
import go from "highlight.js/lib/languages/go";
import java from "highlight.js/lib/languages/java";
import javascript from "highlight.js/lib/languages/javascript";
import json from "highlight.js/lib/languages/json";
import python from "highlight.js/lib/languages/python";
import rust from "highlight.js/lib/languages/rust";
import sql from "highlight.js/lib/languages/sql";
import typescript from "highlight.js/lib/languages/typescript";
import xml from "highlight.js/lib/languages/xml";
import yaml from "highlight.js/lib/languages/yaml";

const languages = { bash, c, cpp, css, go, java, javascript, json, python, rust, sql, typescript, xml, yaml };
for (const [name, lang] of Object.entries(languages)) hljs.registerLanguage(name, lang);

function escapeHtml(s: string): string {
  return s.replace(/[&<>"']/g, (ch) => `&#${ch.charCodeAt(0)};`);
}

const marked = new Marked({ gfm: true, breaks: false });
marked.use({
  renderer: {
    html(token) {
      return escapeHtml(token.text);
    },
  },
});

const PURIFY = {
  FORBID_TAGS: ["img", "style", "iframe", "form", "input", "button", "textarea", "select", "video", "audio", "svg", "math"],
  FORBID_ATTR: ["style"],
};

// Links open in a new tab without handing it this page.
DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A") {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer");
  }
});

/** Sanitized HTML for `text` (Markdown). */
export function renderMarkdown(text: string): string {
  const html = marked.parse(text, { async: false }) as string;
  return DOMPurify.sanitize(html, PURIFY) as string;
}

/** Highlights the code blocks under `root` (their text is escaped by highlight.js). */
export function highlightCode(root: HTMLElement): void {
  root.querySelectorAll("pre code").forEach((el) => {
    const code = el as HTMLElement;
    const m = /language-([\w+-]+)/.exec(code.className);
    const lang = m && hljs.getLanguage(m[1]) ? m[1] : null;
    const text = code.textContent ?? "";
    const out = lang ? hljs.highlight(text, { language: lang }) : hljs.highlightAuto(text);
    code.innerHTML = out.value;
    code.classList.add("hljs");
  });
}
