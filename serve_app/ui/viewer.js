// probserve's token-probability viewer. It calls the public API of the service that serves it,
// with the caller's key, like any client: POST /v1/completions with echo (the text's scores),
// logprob_start_len (a span), logprob_token_ids (labels); /tokenize for chat and labels;
// POST /v1/chat/completions with score_final_message (a conversation's final reply).
// No inline script or style: the page is served with a strict Content-Security-Policy, and
// colours are set through the CSSOM, which that policy allows.
"use strict";

const API = new URL("../", document.baseURI); // the page lives at <service>/ui/
const KEY_STORAGE = "probserve.apiKey";
const LOGPROB_FLOOR = -12; // the scale's darkest colour: e^-12, about 6 in a million
const DIFFERENCE_SPAN = 6; // the difference scale's ends, in nats
// Colour-blind-safe scales: viridis (sequential) and PuOr (diverging), both from matplotlib.
const VIRIDIS = ["#440154", "#472d7b", "#3b528b", "#2c728e", "#21918c", "#28ae80", "#5ec962", "#addc30", "#fde725"];
const PUOR = ["#b35806", "#e08214", "#fdb863", "#fee0b6", "#f7f7f7", "#d8daeb", "#b2abd2", "#8073ac", "#542788"];

const $ = (id) => document.getElementById(id);
const state = { models: [], results: [], exportable: null, span: null };

// ---- the API -------------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, envelope, retryAfter) {
    const error = (envelope && envelope.error) || {};
    super(error.message || `HTTP ${status}`);
    this.status = status;
    this.code = error.code || "http_error";
    this.retryAfter = retryAfter;
  }

  describe() {
    const wait = this.retryAfter ? ` (retry in ${this.retryAfter} s)` : "";
    return `${this.status} ${this.code}: ${this.message}${wait}`;
  }
}

async function api(path, body) {
  const headers = { Accept: "application/json" };
  const key = sessionStorage.getItem(KEY_STORAGE);
  if (key) headers.Authorization = `Bearer ${key}`;
  const init = { headers, cache: "no-store" };
  if (body !== undefined) {
    Object.assign(init, { method: "POST", body: JSON.stringify(body) });
    headers["Content-Type"] = "application/json";
  }
  const response = await fetch(new URL(path, API), init);
  const payload = await response.json().catch(() => null);
  if (!response.ok) throw new ApiError(response.status, payload, response.headers.get("Retry-After"));
  return payload;
}

function caps(model) {
  const card = state.models.find((m) => m.id === model);
  return (card && card.capabilities) || {};
}

function topK(model) {
  const asked = Math.max(1, Number.parseInt($("top-k").value, 10) || 1);
  return Math.min(asked, caps(model).max_logprobs ?? asked);
}

// The prompt as /v1/completions takes it: the text, or the chat messages rendered by the
// model's own template (as token ids, so that what is scored is exactly what was rendered).
async function promptFor(model) {
  if (inputKind() === "text") return $("text").value;
  const rendered = await api("tokenize", { model, messages: chatMessages(), add_generation_prompt: false });
  return rendered.tokens;
}

// The whole prompt echoed and scored: max_tokens is at least 1, so one token is generated and
// left out of the view. prompt_logprobs gives each token's true rank and the alternatives' ids.
async function scoreText(model, prompt) {
  const k = topK(model);
  const answer = await api("v1/completions", {
    model, prompt, echo: true, max_tokens: 1, temperature: 0, logprobs: k, prompt_logprobs: k,
  });
  const choice = answer.choices[0];
  const length = answer.usage.prompt_tokens;
  // The text ends where the generated token starts.
  const end = choice.logprobs.text_offset[length] ?? Array.from(choice.text).length;
  return { model, answer, k, text: choice.text, end, scores: tokenScores(answer, 0, length) };
}

// Tokens first..last of the prompt (inclusive) scored alone: the prompt up to the span's end,
// scored from its start, the tokens before it read from the engine's prefix cache.
async function scoreSpan(model, ids, first, last) {
  const k = topK(model);
  const answer = await api("v1/completions", {
    model, prompt: ids.slice(0, last + 1), logprob_start_len: first, max_tokens: 1, temperature: 0, logprobs: k,
  });
  return { model, answer, k, scores: tokenScores(answer, first, last + 1) };
}

// The final message of the conversation scored alone, in the context of the messages before
// it: each of its tokens with its piece of the message's text and that piece's offset.
async function scoreReply(model) {
  const k = topK(model);
  const messages = chatMessages();
  const answer = await api("v1/chat/completions", {
    model, messages, score_final_message: true, top_logprobs: k, max_tokens: 1, temperature: 0,
    add_generation_prompt: false,
  });
  const text = messages.at(-1).content;
  const scores = answer.final_message_logprobs.content.map((token, index) => ({
    index, id: token.token_id, piece: token.token, offset: token.text_offset, logprob: token.logprob,
    rank: token.rank, alternatives: token.top_logprobs.map((a, i) => ({ text: a.token, logprob: a.logprob, rank: i + 1 })),
  }));
  const title = `${model}: the final ${messages.at(-1).role} message`;
  return { model, title, answer, k, text, end: Array.from(text).length, scores };
}

// Prompt positions start..end-1 of an answer as one object per token, whatever the request
// shape: `logprobs` starts at `start` (echo: 0), `prompt_logprobs` (when asked) at 0.
function tokenScores(answer, start, end) {
  const choice = answer.choices[0];
  const lp = choice.logprobs;
  const rows = choice.prompt_logprobs;
  const tokens = [];
  for (let i = 0; i < end - start; i++) {
    const id = lp.token_ids[i];
    const logprob = lp.token_logprobs[i];
    const alternatives = rows ? rankedRow(rows[start + i]) : rankedTop(lp.top_logprobs[i]);
    const own = rows && rows[start + i] ? rows[start + i][String(id)] : null;
    const ranked = alternatives.findIndex((a) => (a.id === undefined ? a.text === lp.tokens[i] : a.id === id));
    const rank = own ? own.rank : ranked >= 0 ? ranked + 1 : null;
    tokens.push({ index: start + i, id, piece: lp.tokens[i], offset: lp.text_offset[i], logprob, rank, alternatives });
  }
  return tokens;
}

function rankedRow(row) {
  if (!row) return [];
  return Object.entries(row)
    .map(([id, entry]) => ({ id: Number(id), text: entry.decoded_token, logprob: entry.logprob, rank: entry.rank }))
    .sort((a, b) => a.rank - b.rank);
}

function rankedTop(top) {
  if (!top) return [];
  return Object.entries(top)
    .map(([text, logprob]) => ({ text, logprob }))
    .sort((a, b) => b.logprob - a.logprob)
    .map((entry, i) => ({ ...entry, rank: i + 1 }));
}

// ---- input ---------------------------------------------------------------------------------

function inputKind() {
  return document.querySelector("input[name=input-kind]:checked").value;
}

function chatMessages() {
  return [...$("messages").children].map((item) => ({
    role: item.querySelector("select").value,
    content: item.querySelector("textarea").value,
  }));
}

function addMessage(role = "user", content = "") {
  const item = document.createElement("li");
  const roles = document.createElement("select");
  roles.setAttribute("aria-label", "Role");
  for (const name of ["system", "user", "assistant"]) roles.add(new Option(name, name, false, name === role));
  const text = document.createElement("textarea");
  text.rows = 2;
  text.value = content;
  text.setAttribute("aria-label", "Message");
  const remove = document.createElement("button");
  remove.type = "button";
  remove.textContent = "Remove";
  remove.addEventListener("click", () => item.remove());
  item.append(roles, text, remove);
  $("messages").append(item);
}

function showInputKind() {
  const chat = inputKind() === "chat";
  $("text-input").hidden = chat;
  $("chat-input").hidden = !chat;
  if (chat && !$("messages").children.length) {
    addMessage("user", "What is the capital of France?");
    addMessage("assistant", "The capital of France is Paris.");
  }
}

// ---- colours -------------------------------------------------------------------------------

function interpolate(stops, t) {
  const x = Math.min(1, Math.max(0, t)) * (stops.length - 1);
  const i = Math.min(stops.length - 2, Math.floor(x));
  const [a, b] = [stops[i], stops[i + 1]].map((hex) => [1, 3, 5].map((j) => Number.parseInt(hex.slice(j, j + 2), 16)));
  return a.map((channel, j) => Math.round(channel + (b[j] - channel) * (x - i)));
}

function paint(element, rgb) {
  const [r, g, b] = rgb;
  element.style.backgroundColor = `rgb(${r}, ${g}, ${b})`;
  element.style.color = 0.2126 * r + 0.7152 * g + 0.0722 * b < 128 ? "#fff" : "#111";
}

const logprobColour = (logprob) => interpolate(VIRIDIS, 1 - logprob / LOGPROB_FLOOR);
const differenceColour = (difference) => interpolate(PUOR, 0.5 + difference / (2 * DIFFERENCE_SPAN));

// ---- rendering -----------------------------------------------------------------------------

const isScored = (logprob) => logprob !== null && logprob !== undefined;

// One token view: the text as written up to `end` (code points), each scored token a
// focusable span at its text_offset. A token with no room in the text (a BOS the tokenizer
// added) shows as a marker; one that ends inside a character is an empty span.
function tokenView(title, text, end, tokens, colour, describe) {
  const view = document.createElement("section");
  view.className = "view";
  const heading = Object.assign(document.createElement("h2"), { textContent: title });
  const body = document.createElement("div");
  body.className = "tokens";
  const chars = Array.from(text).slice(0, end);
  const fragment = document.createDocumentFragment();
  let written = 0;
  tokens.forEach((token, i) => {
    const next = i + 1 < tokens.length ? tokens[i + 1].offset : chars.length;
    if (token.offset > written) fragment.append(chars.slice(written, token.offset).join(""));
    const piece = chars.slice(token.offset, next).join("");
    const span = document.createElement("span");
    span.className = "token";
    span.tabIndex = 0;
    span.dataset.index = String(token.index);
    span.dataset.offset = String(token.offset);
    span.textContent = token.piece;
    if (piece === token.piece) written = Math.max(written, next);
    else span.classList.add("special");
    if (!token.piece) span.classList.add("partial");
    const shade = isScored(token.logprob) ? colour(token) : null;
    if (isScored(token.logprob)) span.dataset.logprob = String(token.logprob);
    if (shade) paint(span, shade);
    else span.classList.add("unscored");
    fragment.append(span);
  });
  if (written < chars.length) fragment.append(chars.slice(written).join(""));
  body.append(fragment);
  const show = (event) => showTooltip(event.target, describe);
  body.addEventListener("mouseover", show);
  body.addEventListener("focusin", show);
  body.addEventListener("mouseout", hideTooltip);
  body.addEventListener("focusout", hideTooltip);
  view.append(heading, body, totals(tokens));
  return view;
}

function totals(tokens) {
  const scored = tokens.map((t) => t.logprob).filter(isScored);
  const sum = scored.reduce((a, b) => a + b, 0);
  const mean = scored.length ? sum / scored.length : 0;
  const list = document.createElement("dl");
  list.className = "totals";
  const entries = [
    ["tokens", "count", String(scored.length)], ["sum log-probability", "sum", sum.toFixed(4)],
    ["mean log-probability", "mean", mean.toFixed(4)],
    ["perplexity", "perplexity", scored.length ? Math.exp(-mean).toFixed(3) : "–"],
  ];
  for (const [name, key, value] of entries) {
    list.append(Object.assign(document.createElement("dt"), { textContent: name }),
      Object.assign(document.createElement("dd"), { textContent: value, className: `total-${key}` }));
  }
  list.dataset.sum = String(sum);
  return list;
}

const quoted = (piece) => JSON.stringify(piece);
const formatLogprob = (logprob) => (isScored(logprob) ? logprob.toFixed(4) : "–");

// What a tooltip says of the token at prompt position i of a scored text.
function describeScores(scores, k) {
  const byIndex = new Map(scores.map((t) => [t.index, t]));
  return (i) => {
    const token = byIndex.get(i);
    const scored = isScored(token.logprob);
    const lines = [
      ["token", `${quoted(token.piece)} (id ${token.id})`],
      ["log-probability", formatLogprob(token.logprob)],
      ["probability", scored ? `${(100 * Math.exp(token.logprob)).toPrecision(3)} %` : "–"],
      ["rank", !scored ? "–" : token.rank ? String(token.rank) : `> ${k}`],
    ];
    return { lines, alternatives: token.alternatives, own: token };
  };
}

function describeDifference(first, second) {
  return (i) => {
    const [a, b] = [first.scores[i], second.scores[i]];
    const lines = [
      ["token", `${quoted(a.piece)} (id ${a.id})`],
      [first.model, formatLogprob(a.logprob)],
      [second.model, formatLogprob(b.logprob)],
      ["difference", isScored(a.logprob) ? formatLogprob(b.logprob - a.logprob) : "–"],
    ];
    return { lines, alternatives: [], own: a };
  };
}

function showTooltip(target, describe) {
  if (!target.classList || !target.classList.contains("token")) return;
  const { lines, alternatives, own } = describe(Number(target.dataset.index));
  const tip = $("tooltip");
  const facts = document.createElement("dl");
  for (const [name, value] of lines) {
    facts.append(Object.assign(document.createElement("dt"), { textContent: name }),
      Object.assign(document.createElement("dd"), { textContent: value }));
  }
  tip.replaceChildren(facts);
  if (alternatives.length) tip.append(alternativesTable(alternatives, own));
  tip.hidden = false;
  const box = target.getBoundingClientRect();
  const right = window.scrollX + document.documentElement.clientWidth - tip.offsetWidth - 8;
  tip.style.left = `${Math.max(0, Math.min(window.scrollX + box.left, right))}px`;
  tip.style.top = `${window.scrollY + box.bottom + 6}px`;
}

function alternativesTable(alternatives, own) {
  const table = document.createElement("table");
  table.className = "alternatives";
  table.createCaption().textContent = "alternatives";
  for (const alternative of alternatives) {
    const row = table.insertRow();
    if (alternative.id === undefined ? alternative.text === own.piece : alternative.id === own.id) row.className = "own";
    for (const cell of [String(alternative.rank), quoted(alternative.text), formatLogprob(alternative.logprob)]) {
      row.insertCell().textContent = cell;
    }
  }
  return table;
}

function hideTooltip() {
  $("tooltip").hidden = true;
}

function legendFor(stops, labels) {
  const legend = document.createElement("div");
  legend.className = "legend";
  const bar = Object.assign(document.createElement("div"), { className: "legend-bar" });
  bar.style.backgroundImage = `linear-gradient(to right, ${stops.join(", ")})`;
  const ends = Object.assign(document.createElement("div"), { className: "legend-ends" });
  for (const text of labels) ends.append(Object.assign(document.createElement("span"), { textContent: text }));
  legend.append(bar, ends);
  return legend;
}

const LOGPROB_LEGEND = () => legendFor(VIRIDIS, [`log-probability ≤ ${LOGPROB_FLOOR} (unlikely)`, `${LOGPROB_FLOOR / 2}`, "0 (certain)"]);
const DIFFERENCE_LEGEND = () => legendFor(PUOR, [`≤ −${DIFFERENCE_SPAN}: the second model lower`, "0", `≥ +${DIFFERENCE_SPAN}: higher`]);

function shadeLogprob(token) {
  return logprobColour(token.logprob);
}

// The views of one or two models' scores, and their difference where they tokenize alike.
function show(views, legends) {
  const started = performance.now();
  $("views").replaceChildren(...views);
  $("legend").replaceChildren(...legends);
  $("results").hidden = false;
  void $("results").offsetHeight; // the layout too, as the reader waits for it
  $("results").dataset.renderMs = String(performance.now() - started);
}

function scoresView(result, title = result.title || result.model) {
  return tokenView(title, result.text, result.end, result.scores, shadeLogprob, describeScores(result.scores, result.k));
}

function showWhole(results) {
  const [first, second] = results;
  const views = results.map((result) => scoresView(result));
  if (!second) return show(views, [LOGPROB_LEGEND()]);
  const alike = second.scores.length === first.scores.length && second.scores.every((t, i) => t.id === first.scores[i].id);
  if (!alike) {
    const note = Object.assign(document.createElement("p"), {
      className: "note",
      textContent: "The two models tokenize this text differently: each is shaded on its own, with no token-by-token difference.",
    });
    return show([...views, note], [LOGPROB_LEGEND()]);
  }
  const difference = (token) => differenceColour(second.scores[token.index].logprob - token.logprob);
  views.push(tokenView(`difference: ${second.model} − ${first.model}`, first.text, first.end, first.scores,
    difference, describeDifference(first, second)));
  return show(views, [LOGPROB_LEGEND(), DIFFERENCE_LEGEND()]);
}

// A span's scores in place in the whole text: the tokens outside it unscored.
function spanInText(whole, span) {
  const byIndex = new Map(span.scores.map((t) => [t.index, t]));
  const scores = whole.scores.map((token) => byIndex.get(token.index) ?
    { ...byIndex.get(token.index), offset: token.offset, piece: token.piece } :
    { ...token, logprob: undefined, rank: null, alternatives: [] });
  return { ...whole, k: span.k, scores };
}

// ---- actions -------------------------------------------------------------------------------

async function run(what, action) {
  $("error").hidden = true;
  $("status").textContent = `${what}…`;
  for (const button of document.querySelectorAll("#request button")) button.disabled = true;
  try {
    await action();
    $("status").textContent = `${what}: done`;
  } catch (error) {
    $("status").textContent = "";
    showError(error);
  } finally {
    for (const button of document.querySelectorAll("#request button")) button.disabled = false;
    $("score-span").disabled = !state.span;
  }
}

function showError(error) {
  const box = $("error");
  box.textContent = error instanceof ApiError ? error.describe() : `The request failed: ${error.message}`;
  box.dataset.code = error.code || "";
  box.hidden = false;
  if (error.status === 401) $("key-row").hidden = false;
}

function selectedModels() {
  return [$("model").value, $("compare-model").value].filter(Boolean);
}

async function scoreWhole() {
  const models = selectedModels();
  const results = await Promise.all(models.map(async (model) => scoreText(model, await promptFor(model))));
  Object.assign(state, { results, exportable: results, span: null });
  spanChosen(null);
  $("score-whole").hidden = true;
  $("label-bars").replaceChildren();
  showWhole(results);
}

// The final reply, by each model chosen. Its tokens are not the prompt's positions, so no span
// of it is scored alone.
async function scoreFinalReply() {
  const results = await Promise.all(selectedModels().map(scoreReply));
  Object.assign(state, { results: [], exportable: results });
  spanChosen(null);
  $("score-whole").hidden = true;
  $("label-bars").replaceChildren();
  showWhole(results);
}

// The selected span scored alone by each model shown, in place in the whole text.
async function scoreSelectedSpan() {
  const { first, last } = state.span;
  const spans = await Promise.all(state.results.map((whole) =>
    scoreSpan(whole.model, whole.scores.map((t) => t.id), first, last)));
  state.exportable = spans;
  $("score-whole").hidden = false;
  const title = (model) => `${model}: tokens ${first}–${last} alone`;
  show(spans.map((span, i) => scoresView(spanInText(state.results[i], span), title(span.model))), [LOGPROB_LEGEND()]);
}

// The tokens a selection in the first view covers become the span to score. A selection that
// collapses (a click on the button) keeps the last one.
function selectionToSpan() {
  const selection = window.getSelection();
  const view = document.querySelector("#views .tokens");
  if (!view || !selection.rangeCount || selection.isCollapsed || !state.results.length) return;
  const range = selection.getRangeAt(0);
  const covered = [...view.querySelectorAll(".token")].filter((span) => range.intersectsNode(span));
  if (covered.length) spanChosen({ first: Number(covered[0].dataset.index), last: Number(covered.at(-1).dataset.index) });
}

function spanChosen(span) {
  state.span = span;
  $("score-span").disabled = !span;
  $("score-span").textContent = span ? `Score tokens ${span.first}–${span.last} alone` : "Score the selected span";
}

// Each label by its first token: its id from /tokenize, its text as top_logprobs keys it.
async function labelTokens(model, labels) {
  return Promise.all(labels.map(async (label) => {
    const ids = (await api("tokenize", { model, prompt: label, add_special_tokens: false })).tokens;
    if (!ids.length) throw new Error(`the label ${quoted(label)} has no tokens`);
    const piece = (await api("detokenize", { model, tokens: [ids[0]] })).prompt;
    return { label, id: ids[0], piece, tokens: ids.length };
  }));
}

async function scoreLabels() {
  const model = $("model").value;
  const labels = $("labels").value.split("\n").map((l) => l.replace(/\r$/, "")).filter((l) => l.trim());
  if (!labels.length) throw new Error("write at least one label, one a line");
  const [prompt, tokens] = await Promise.all([promptFor(model), labelTokens(model, labels)]);
  const ids = [...new Set(tokens.map((t) => t.id))];
  const answer = await api("v1/completions", { model, prompt, max_tokens: 1, temperature: 0, logprob_token_ids: ids });
  const scores = answer.choices[0].logprobs.top_logprobs[0];
  const missing = tokens.find((t) => !(t.piece in scores));
  if (missing) throw new Error(`the answer has no score for the label ${quoted(missing.label)} (token ${quoted(missing.piece)})`);
  const scored = tokens.map((t) => ({ ...t, logprob: scores[t.piece] }));
  state.exportable = [{ model, answer, labels: scored }];
  labelBars(scored);
}

function labelBars(scored) {
  const box = $("label-bars");
  box.replaceChildren(Object.assign(document.createElement("h2"), { textContent: "Labels: the next token" }));
  const total = scored.reduce((sum, l) => sum + Math.exp(l.logprob), 0);
  for (const label of scored) {
    const probability = Math.exp(label.logprob);
    const row = document.createElement("div");
    row.className = "label";
    row.dataset.logprob = String(label.logprob);
    const name = Object.assign(document.createElement("span"), { className: "label-name", textContent: quoted(label.label) });
    const track = Object.assign(document.createElement("span"), { className: "label-track" });
    const bar = Object.assign(document.createElement("span"), { className: "label-bar" });
    bar.style.width = `${(100 * probability) / total}%`;
    paint(bar, logprobColour(label.logprob));
    track.append(bar);
    const first = label.tokens > 1 ? `, by its first token ${quoted(label.piece)} of ${label.tokens}` : "";
    const value = Object.assign(document.createElement("span"), {
      className: "label-value",
      textContent: `p = ${probability.toPrecision(3)}, ${((100 * probability) / total).toFixed(1)} % of the labels (log-probability ${label.logprob.toFixed(4)}${first})`,
    });
    row.append(name, track, value);
    box.append(row);
  }
  $("results").hidden = false;
}

// ---- export --------------------------------------------------------------------------------

function download(name, type, content) {
  const link = document.createElement("a");
  link.href = URL.createObjectURL(new Blob([content], { type }));
  link.download = name;
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(link.href), 10000);
}

function exportJson() {
  const answers = state.exportable.map(({ model, answer, labels }) => ({ model, answer, ...(labels ? { labels } : {}) }));
  download("probserve-scores.json", "application/json", JSON.stringify(answers, null, 2));
}

function csvField(value) {
  const text = value === null || value === undefined ? "" : String(value);
  return /[",\n\r]/.test(text) ? `"${text.replace(/"/g, '""')}"` : text;
}

function exportCsv() {
  const rows = [["model", "index", "text_offset", "token", "token_id", "logprob", "rank", "alternatives"]];
  for (const result of state.exportable) {
    for (const t of result.scores || []) {
      const alternatives = t.alternatives.map((a) => `${a.text}=${a.logprob}`).join(" | ");
      rows.push([result.model, t.index, t.offset, t.piece, t.id, t.logprob, t.rank, alternatives]);
    }
    for (const l of result.labels || []) rows.push([result.model, "", "", l.label, l.id, l.logprob, "", ""]);
  }
  download("probserve-scores.csv", "text/csv", rows.map((row) => row.map(csvField).join(",")).join("\r\n") + "\r\n");
}

// ---- start ---------------------------------------------------------------------------------

async function loadModels() {
  const list = await api("v1/models");
  state.models = list.data;
  for (const select of [$("model"), $("compare-model")]) {
    const keep = select.id === "compare-model" ? [select.options[0]] : [];
    select.replaceChildren(...keep, ...list.data.map((m) => new Option(m.id, m.id)));
  }
  $("key-row").hidden = !sessionStorage.getItem(KEY_STORAGE);
  $("error").hidden = true;
}

function useKey() {
  const key = $("api-key").value.trim();
  if (key) sessionStorage.setItem(KEY_STORAGE, key);
  else sessionStorage.removeItem(KEY_STORAGE);
  run("Loading the models", loadModels);
}

function start() {
  $("use-key").addEventListener("click", useKey);
  $("score").addEventListener("click", () => run("Scoring", scoreWhole));
  $("score-span").addEventListener("click", () => run("Scoring the span", scoreSelectedSpan));
  $("score-whole").addEventListener("click", () => {
    state.exportable = state.results;
    $("score-whole").hidden = true;
    showWhole(state.results);
  });
  $("score-labels").addEventListener("click", () => run("Scoring the labels", scoreLabels));
  $("add-message").addEventListener("click", () => addMessage());
  $("score-reply").addEventListener("click", () => run("Scoring the final reply", scoreFinalReply));
  $("export-json").addEventListener("click", exportJson);
  $("export-csv").addEventListener("click", exportCsv);
  for (const radio of document.querySelectorAll("input[name=input-kind]")) radio.addEventListener("change", showInputKind);
  document.addEventListener("selectionchange", selectionToSpan);
  document.addEventListener("keydown", (event) => event.key === "Escape" && hideTooltip());
  run("Loading the models", loadModels);
}

start();
