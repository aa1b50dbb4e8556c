// Streamed tokens as page elements: a chunk's token texts and logprobs in either response
// format, one span per token carrying its origin marks, and the hover text that describes it.
// Model text only ever reaches the page through textContent, never as HTML.
// Exposed as window.TandemTokens.
(function (root) {
  "use strict";

  // Token texts and logprobs of one choice of a chunk, chat or completions.
  function tokenTexts(choice) {
    const lp = choice.logprobs;
    if (lp && Array.isArray(lp.content)) {  // chat
      return {texts: lp.content.map((t) => t.token), logprobs: lp.content.map((t) => t.logprob)};
    }
    if (lp && Array.isArray(lp.tokens)) {   // completions
      return {texts: lp.tokens, logprobs: lp.token_logprobs};
    }
    const text = choice.text !== undefined ? choice.text : (choice.delta && choice.delta.content);
    return {texts: text ? [text] : [], logprobs: []};
  }

  // origin: "draft" | "ngram" | "suffix" | "target" | "unknown" (ngram, suffix: a lookup's
  // draft, coloured apart from a draft model's); kind: RequestStats.add's "accepted", "recovered",
  // "bonus" or "plain"; position: the draft position of an accepted token, else null.
  function tokenSpan(text, origin, kind, position, id, logprob, guess) {
    const span = document.createElement("span");
    span.className = "tok " + origin + " " + kind;
    span.textContent = text === "" ? "∅" : text;
    span.dataset.origin = origin;
    span.dataset.kind = kind;
    if (position !== null) span.dataset.position = String(position);
    if (id !== undefined) span.dataset.tokenId = String(id);
    if (logprob !== undefined && logprob !== null) span.dataset.logprob = String(logprob);
    if (guess !== null) span.dataset.rejected = guess;
    return span;
  }

  const LOOKUPS = {ngram: "n-gram lookup's draft", suffix: "suffix tree's draft"};

  // The hover text: the token's origin, id, logprob and the draft's rejected guess.
  function describe(span) {
    const d = span.dataset;
    const lines = [];
    const what = {
      accepted: (LOOKUPS[d.origin] || "draft token") + ", accepted by the target (draft position "
        + (Number(d.position) + 1) + ")",
      recovered: "target token, sampled after rejecting the draft's guess",
      bonus: "target token: the bonus after every draft was accepted",
    };
    lines.push(what[d.kind] || (d.origin === "target" ? "target token (no draft at this step)"
                                                      : "origin unknown"));
    if (d.rejected !== undefined) lines.push("rejected draft: " + JSON.stringify(d.rejected));
    const id = d.tokenId !== undefined ? "token id " + d.tokenId : "token id ?";
    const lp = d.logprob !== undefined
      ? "logprob " + Number(d.logprob).toFixed(3) + " (p = " + Math.exp(Number(d.logprob)).toFixed(3) + ")"
      : "logprob ?";
    lines.push(id + " · " + lp);
    lines.push("text " + JSON.stringify(span.textContent));
    return lines.join("\n");
  }

  // Which of a chat chunk's tokens are reasoning (a server with --reasoning-parser streams it as
  // delta.reasoning_content). The reasoning text takes the first tokens; after it, a think tag
  // stays with the reasoning, and so does every token of a chunk without answer text while the
  // reasoning goes on (a tag the server held back); the rest are the answer's.
  // inReasoning: whether the request's reasoning was still going on before this chunk.
  const THINK_TAGS = ["<think>", "</think>"];
  function reasoningFlags(delta, texts, inReasoning) {
    const reasoning = (delta && (delta.reasoning_content || delta.reasoning)) || "";
    const hasAnswer = !!(delta && (delta.content || (delta.tool_calls && delta.tool_calls.length)));
    const thinking = inReasoning || reasoning !== "";
    let left = reasoning.length;
    return texts.map((text) => {
      if (left > 0) { left -= text.length; return true; }
      return thinking && (THINK_TAGS.includes(text) || !hasAnswer);
    });
  }

  root.TandemTokens = {tokenTexts, tokenSpan, describe, reasoningFlags};
})(window);
