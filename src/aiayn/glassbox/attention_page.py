"""A self-contained interactive attention page (one HTML file, inline JS, no network).

In the spirit of BertViz's head view: pick a sentence, the kind of attention, a layer and a
head (or all heads, one colour each); lines join each query token (left) to the keys it attends
to (right), their opacity the attention weight; hover a token to see only its lines. A heatmap
of the same weights sits beside. The data is embedded as JSON, rounded to 4 decimals.
"""

from __future__ import annotations

import html
import json

from aiayn.glassbox.viz import KINDS, AttentionExample


def page_data(examples: list[AttentionExample], titles: list[str] | None = None) -> dict:
    """The JSON the page draws from: per example, labels and weights [layer][head][query][key]."""
    data = []
    for i, ex in enumerate(examples):
        kinds = {}
        for kind in ex.maps:
            rows, cols = ex.labels(kind)
            w = [
                [[[round(float(v), 4) for v in row] for row in head] for head in layer]
                for layer in ex.maps[kind]
            ]
            kinds[kind] = {"rows": rows, "cols": cols, "w": w}
        title = titles[i] if titles else " ".join(ex.src)
        data.append({"title": title, "out": ex.out, "kinds": kinds})
    return {"examples": data, "kind_names": KINDS}


def attention_page(examples: list[AttentionExample], titles: list[str] | None = None) -> str:
    """The whole page as a string (write it with any name ending in .html)."""
    if not examples:
        raise ValueError("no examples to show")
    # `</` inside a <script> element would end it early; JSON allows the escape `<\/`.
    blob = json.dumps(page_data(examples, titles), ensure_ascii=False).replace("</", "<\\/")
    first = html.escape(" ".join(examples[0].src))
    return _TEMPLATE.replace("__DATA__", blob).replace("__TITLE__", first)


_TEMPLATE = """<!doctype html>
<html><head><meta charset="utf-8"><title>aiayn attention: __TITLE__</title>
<style>
body{font:14px system-ui,sans-serif;margin:1.2em;color:#222}
label{margin-right:1em}select{font-size:14px}
#views{display:flex;gap:2em;align-items:flex-start;margin-top:1em}
.tok{font:13px ui-monospace,monospace;cursor:default}.tok.hot{font-weight:bold;fill:#c00}
#legend span{display:inline-block;padding:1px 6px;margin-right:4px;color:#fff;border-radius:3px}
#info{font:12px ui-monospace,monospace;white-space:pre;color:#444;min-height:3em}
</style></head><body>
<h2>aiayn attention view</h2>
<div>
<label>sentence <select id="example"></select></label>
<label>attention <select id="kind"></select></label>
<label>layer <select id="layer"></select></label>
<label>head <select id="head"></select></label>
</div>
<p id="output"></p><div id="legend"></div>
<div id="views"><svg id="lines" xmlns="http://www.w3.org/2000/svg"></svg>
<svg id="heat" xmlns="http://www.w3.org/2000/svg"></svg></div>
<div id="info">hover a token to see where it attends (left: queries) or what attends to it
(right: keys)</div>
<script type="application/json" id="data">__DATA__</script>
<script>
"use strict";
const DATA = JSON.parse(document.getElementById("data").textContent);
const COLORS = ["#1f77b4","#ff7f0e","#2ca02c","#d62728","#9467bd","#8c564b","#e377c2",
                "#7f7f7f","#bcbd22","#17becf","#393b79","#637939","#8c6d31","#843c39",
                "#7b4173","#3182bd"];
const SVG = "http://www.w3.org/2000/svg";
const $ = (id) => document.getElementById(id);
const state = {example: 0, kind: "", layer: 0, head: "all", hover: null};

function el(name, attrs, parent, text) {
  const e = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  parent.appendChild(e);
  return e;
}
function fill(select, items) {
  select.innerHTML = "";
  for (const [value, text] of items) {
    const o = document.createElement("option");
    o.value = value; o.textContent = text; select.appendChild(o);
  }
}
function current() {
  const k = DATA.examples[state.example].kinds[state.kind];
  const heads = state.head === "all" ? k.w[state.layer].map((_, h) => h) : [Number(state.head)];
  return {k, heads};
}
function drawLines() {
  const {k, heads} = current();
  const svg = $("lines"); svg.innerHTML = "";
  const rowH = 20, width = 420, top = 24;
  const n = Math.max(k.rows.length, k.cols.length);
  svg.setAttribute("width", width); svg.setAttribute("height", top + n * rowH + 10);
  el("text", {x: 10, y: 14, "font-size": 11, fill: "#666"}, svg, "queries");
  el("text", {x: width - 60, y: 14, "font-size": 11, fill: "#666"}, svg, "keys");
  const g = el("g", {id: "edges"}, svg);
  const xl = 130, xr = width - 130, y = (i) => top + i * rowH + rowH / 2;
  for (const h of heads) {
    const w = k.w[state.layer][h];
    for (let i = 0; i < k.rows.length; i++) {
      if (state.hover && state.hover.side === "q" && state.hover.i !== i) continue;
      for (let j = 0; j < k.cols.length; j++) {
        if (state.hover && state.hover.side === "k" && state.hover.i !== j) continue;
        const a = w[i][j];
        if (a < 0.01) continue;
        el("line", {x1: xl, y1: y(i), x2: xr, y2: y(j), stroke: COLORS[h % COLORS.length],
                    "stroke-width": 2, "stroke-opacity": a.toFixed(3)}, g);
      }
    }
  }
  k.rows.forEach((t, i) => token(svg, xl - 6, y(i), t, "end", "q", i));
  k.cols.forEach((t, j) => token(svg, xr + 6, y(j), t, "start", "k", j));
}
function token(svg, x, y, text, anchor, side, i) {
  const hot = state.hover && state.hover.side === side && state.hover.i === i;
  const t = el("text", {x, y: y + 4, "text-anchor": anchor, class: hot ? "tok hot" : "tok"},
               svg, text);
  t.addEventListener("mouseenter", () => { state.hover = {side, i}; draw(); describe(); });
  t.addEventListener("mouseleave", () => { state.hover = null; draw(); });
}
function meanWeights() {
  const {k, heads} = current();
  return k.rows.map((_, i) => k.cols.map((_, j) =>
    heads.reduce((s, h) => s + k.w[state.layer][h][i][j], 0) / heads.length));
}
function drawHeat() {
  const {k, heads} = current();
  const m = meanWeights(), c = 18, left = 110, top = 110;
  const svg = $("heat"); svg.innerHTML = "";
  svg.setAttribute("width", left + k.cols.length * c + 10);
  svg.setAttribute("height", top + k.rows.length * c + 10);
  const color = heads.length === 1 ? COLORS[heads[0] % COLORS.length] : "#333";
  el("text", {x: 0, y: 14, "font-size": 11, fill: "#666"}, svg,
     heads.length === 1 ? "head " + (heads[0] + 1) : "mean of all heads");
  k.cols.forEach((t, j) => el("text", {x: 0, y: 0, class: "tok", "font-size": 11,
    transform: `translate(${left + j * c + c / 2 + 4},${top - 4}) rotate(-90)`}, svg, t));
  k.rows.forEach((t, i) => {
    el("text", {x: left - 4, y: top + i * c + c / 2 + 4, "text-anchor": "end", class: "tok"},
       svg, t);
    k.cols.forEach((_, j) => el("rect", {x: left + j * c, y: top + i * c, width: c - 1,
      height: c - 1, fill: color, "fill-opacity": m[i][j].toFixed(3)}, svg));
  });
}
function describe() {
  if (!state.hover) return;
  const {k} = current(), m = meanWeights();
  const {side, i} = state.hover;
  const pairs = side === "q" ? k.cols.map((t, j) => [t, m[i][j]])
                             : k.rows.map((t, r) => [t, m[r][i]]);
  pairs.sort((a, b) => b[1] - a[1]);
  const who = side === "q" ? k.rows[i] + " attends to" : "attending to " + k.cols[i];
  $("info").textContent = who + ":\\n" +
    pairs.slice(0, 6).map(([t, a]) => `  ${a.toFixed(3)}  ${t}`).join("\\n");
}
function legend() {
  const {k} = current();
  $("legend").innerHTML = "";
  k.w[state.layer].forEach((_, h) => {
    const s = document.createElement("span");
    s.style.background = COLORS[h % COLORS.length]; s.textContent = "head " + (h + 1);
    if (state.head !== "all" && Number(state.head) !== h) s.style.opacity = 0.25;
    $("legend").appendChild(s);
  });
}
function draw() { drawLines(); drawHeat(); legend(); }
function refresh() {  // the selects of the current example and kind, keeping valid choices
  const kinds = Object.keys(DATA.examples[state.example].kinds);
  if (!kinds.includes(state.kind)) state.kind = kinds[0];
  fill($("kind"), kinds.map((k) => [k, DATA.kind_names[k]]));
  $("kind").value = state.kind;
  const w = DATA.examples[state.example].kinds[state.kind].w;
  if (state.layer >= w.length) state.layer = 0;
  fill($("layer"), w.map((_, l) => [l, "layer " + l]));
  $("layer").value = state.layer;
  if (state.head !== "all" && Number(state.head) >= w[0].length) state.head = "all";
  fill($("head"), [["all", "all heads"], ...w[0].map((_, h) => [h, "head " + (h + 1)])]);
  $("head").value = state.head;
}
function setup() {
  fill($("example"), DATA.examples.map((e, i) => [i, (i + 1) + ": " + e.title]));
  state.kind = Object.keys(DATA.examples[0].kinds)[0];
  for (const id of ["example", "kind", "layer", "head"]) {
    $(id).addEventListener("change", () => {
      const v = $(id).value;
      state[id] = id === "kind" || id === "head" ? v : Number(v);
      state.hover = null; update();
    });
  }
  update();
}
function update() {
  refresh();
  const e = DATA.examples[state.example];
  $("output").textContent = e.out.length ? "model output: " + e.out.join(" ")
                                         : "self-attention over the input (no output)";
  draw();
}
window.aiaynView = {state, draw: update};
setup();
</script></body></html>
"""
