// Speculation figures, no DOM: a request's acceptance from its tokens' origin marks, and the
// server's totals from its Prometheus text. Exposed as window.Spec (module.exports under node,
// so the arithmetic can be checked without a browser).
(function (root) {
  "use strict";

  const WINDOW = 8; // verify steps in the "recent" acceptance line
  // Origins of accepted drafts: a draft model's ("draft") or a lookup's ("ngram", "suffix").
  const DRAFTED = new Set(["draft", "ngram", "suffix"]);

  // How a verify step shows in the origin marks: its accepted drafts are a run of "draft" (or
  // "ngram", "suffix": a lookup's) entries, then exactly one "target" (the recovered token after a rejection, or the bonus
  // token when every draft was accepted). Position i of a run is draft position i.
  // A "target" with no run before it and no rejected guess is a step without drafts (the first
  // token after the prompt, or the last one when max_tokens leaves no room to draft).
  class RequestStats {
    // k: drafts proposed per step (the server's number of positions); 0 when unknown.
    constructor(k) {
      this.k = k || 0;
      this.tokens = 0;
      this.draftTokens = 0;
      this.targetTokens = 0;
      this.steps = 0;          // verify steps that carried drafts
      this.accepted = 0;       // drafts accepted, summed over steps
      this.drafted = 0;        // drafts proposed (k per step; fewer when a step shows less)
      this.acceptedByPos = []; // [i] = steps whose draft at position i was accepted
      this.timeline = [];      // one {step, accepted, drafted, rate, windowRate} per step
      this.run = 0;            // drafts accepted so far in the step being read
    }

    // Takes one token; returns what it is: {kind, position} where kind is "accepted" (a draft,
    // at `position`), "recovered", "bonus" or "plain" (target tokens).
    add(origin, rejectedDraft) {
      this.tokens += 1;
      if (DRAFTED.has(origin)) {
        this.draftTokens += 1;
        this.run += 1;
        return {kind: "accepted", position: this.run - 1};
      }
      this.targetTokens += 1;
      const rejected = rejectedDraft !== null && rejectedDraft !== undefined;
      if (rejected) {
        // A rejection at position `run`: the step proposed at least run + 1 drafts.
        this._closeStep(this.run, Math.max(this.k, this.run + 1));
        return {kind: "recovered", position: null};
      }
      if (this.run > 0) {
        // Every proposed draft accepted: k of them, or fewer near the end of max_tokens.
        this._closeStep(this.run, this.run);
        return {kind: "bonus", position: null};
      }
      return {kind: "plain", position: null};
    }

    // The stream ended inside a step (a stop or max_tokens right after accepted drafts).
    finish() {
      if (this.run > 0) this._closeStep(this.run, this.run);
    }

    _closeStep(accepted, drafted) {
      this.steps += 1;
      this.accepted += accepted;
      this.drafted += drafted;
      for (let i = 0; i < accepted; i++) this.acceptedByPos[i] = (this.acceptedByPos[i] || 0) + 1;
      const recent = this.timeline.slice(-(WINDOW - 1));
      const windowAccepted = recent.reduce((s, t) => s + t.accepted, accepted);
      const windowDrafted = recent.reduce((s, t) => s + t.drafted, drafted);
      this.timeline.push({step: this.steps, accepted, drafted,
                          rate: this.accepted / this.drafted,
                          windowRate: windowAccepted / windowDrafted});
      this.run = 0;
    }

    get acceptanceRate() { return this.drafted ? this.accepted / this.drafted : null; }
    // Tokens per verify step, bonus included: 1 + accepted / steps (vLLM's definition).
    get meanAcceptanceLength() { return this.steps ? 1 + this.accepted / this.steps : null; }
    // [i] = share of steps whose draft at position i was accepted (vLLM's per-position rate).
    positionRates() {
      const n = Math.max(this.k, this.acceptedByPos.length);
      const rates = [];
      for (let i = 0; i < n; i++) rates.push(this.steps ? (this.acceptedByPos[i] || 0) / this.steps : null);
      return rates;
    }
  }
  // Prometheus text format -> [{name, labels, value}] (comments and blank lines skipped).
  function parsePrometheus(text) {
    const samples = [];
    const line = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)/;
    const label = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;
    for (const raw of text.split("\n")) {
      if (!raw || raw.startsWith("#")) continue;
      const m = line.exec(raw);
      if (!m) continue;
      const labels = {};
      for (const l of (m[2] || "").matchAll(label)) labels[l[1]] = l[2].replace(/\\(.)/g, "$1");
      samples.push({name: m[1], labels, value: Number(m[3])});
    }
    return samples;
  }

  // The server's totals from vLLM's series, summed over engines and models.
  function serverTotals(samples) {
    const sum = (name) => samples.filter((s) => s.name === name).reduce((a, s) => a + s.value, 0);
    const has = (name) => samples.some((s) => s.name === name);
    const perPos = [];
    for (const s of samples) {
      if (s.name !== "vllm:spec_decode_num_accepted_tokens_per_pos_total") continue;
      const i = Number(s.labels.position);
      perPos[i] = (perPos[i] || 0) + s.value;
    }
    const drafts = sum("vllm:spec_decode_num_drafts_total");
    const draftTokens = sum("vllm:spec_decode_num_draft_tokens_total");
    const accepted = sum("vllm:spec_decode_num_accepted_tokens_total");
    return {
      hasSpec: has("vllm:spec_decode_num_drafts_total"),
      k: perPos.length,
      drafts, draftTokens, accepted,
      generationTokens: sum("vllm:generation_tokens_total"),
      acceptanceRate: draftTokens ? accepted / draftTokens : null,
      meanAcceptanceLength: drafts ? 1 + accepted / drafts : null,
      positionRates: Array.from(perPos, (v) => (drafts ? (v || 0) / drafts : null)),
    };
  }

  const api = {RequestStats, parsePrometheus, serverTotals};
  if (typeof module !== "undefined" && module.exports) module.exports = api;
  else root.Spec = api;
})(this);
