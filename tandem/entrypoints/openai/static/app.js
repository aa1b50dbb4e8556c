// The page's behaviour: send the prompt through the public API with the
// `spec_decode_token_origin` extension, render each streamed token with its origin, and keep the
// request's and the server's figures (and the two charts) current. Uses spec.js (the figures),
// api.js (requests and the SSE reader), tokens.js (token spans) and charts.js.
(function () {
  "use strict";

  const $ = (id) => document.getElementById(id);
  const {ApiError, readStream} = TandemApi;
  const {tokenTexts, tokenSpan, describe, reasoningFlags} = TandemTokens;
  const KEY_STORAGE = "tandem.apiKey";
  const POLL_BUSY_MS = 1000;  // /metrics while a request streams
  const POLL_IDLE_MS = 5000;  // and otherwise (other clients move the totals too)

  const state = {
    apiKey: readStoredKey(),
    model: null,
    server: null,         // the last serverTotals(), null before the first /metrics
    afterKey: null,       // what to retry once the user gives a key
    controller: null,     // AbortController of the request streaming now
    stats: null,          // RequestStats of the current request
    final: null,          // the response's metrics.speculative_decoding, once it arrives
    firstTokenAt: null,
    lastTokenAt: null,
    inReasoning: false,   // the chat answer's reasoning is streaming (no answer text yet)
  };

  // ---- API access -------------------------------------------------------------------------

  function api(path, init) { return TandemApi.request(path, init, state.apiKey); }

  function readStoredKey() {
    try { return localStorage.getItem(KEY_STORAGE) || ""; } catch (e) { return ""; }
  }

  function showError(message) {
    const box = $("error");
    box.textContent = message;
    box.hidden = !message;
  }

  // A 401 asks for the key, then reruns `retry` once it is given.
  function handleFailure(err, retry) {
    if (err instanceof ApiError && err.status === 401) {
      state.afterKey = retry;
      $("api-key-panel").hidden = false;
      $("api-key").focus();
      showError(state.apiKey ? "The API key was refused: " + err.message : err.message);
      return;
    }
    if (err instanceof ApiError) showError("Server error " + err.status + ": " + err.message);
    else if (err instanceof TypeError) showError("Could not reach the server: " + err.message);
    else showError("The request failed: " + err.message);
  }

  function saveKey() {
    state.apiKey = $("api-key").value.trim();
    try { localStorage.setItem(KEY_STORAGE, state.apiKey); } catch (e) { /* private mode */ }
    $("api-key-panel").hidden = true;
    showError("");
    const retry = state.afterKey;
    state.afterKey = null;
    if (retry) retry();
  }

  async function loadModel() {
    try {
      const body = await (await api("/v1/models")).json();
      state.model = body.data[0].id;
      $("model-name").textContent = state.model;
    } catch (err) {
      handleFailure(err, loadModel);
    }
  }

  // ---- server totals from /metrics (no key needed) ----------------------------------------

  let pollTimer = null;

  // Polls now, then again in 1 s while a request streams or 5 s when idle. A request's start
  // and end call it too, so the totals move with the request being watched.
  async function pollMetrics() {
    clearTimeout(pollTimer);
    try {
      const response = await fetch("/metrics");
      if (response.ok) updateServer(Spec.serverTotals(Spec.parsePrometheus(await response.text())));
    } catch (e) { /* the server may be restarting; the next poll tries again */ }
    clearTimeout(pollTimer);
    pollTimer = setTimeout(pollMetrics, state.controller ? POLL_BUSY_MS : POLL_IDLE_MS);
  }

  function updateServer(totals) {
    state.server = totals;
    const status = $("draft-status");
    if (!totals.hasSpec) {
      status.textContent = "no draft model: this server decodes without speculation, " +
        "so every token is the target's";
      status.className = "draft-status none";
      for (const id of ["server-acceptance", "server-mean-acceptance-length", "server-drafts",
                        "server-acceptance-by-position"]) $(id).textContent = "n/a";
    } else {
      status.textContent = "draft model on: " + totals.k + " draft tokens per step";
      status.className = "draft-status on";
      $("server-acceptance").textContent = percent(totals.acceptanceRate);
      $("server-mean-acceptance-length").textContent = fixed(totals.meanAcceptanceLength);
      $("server-drafts").textContent = String(totals.drafts);
      $("server-acceptance-by-position").textContent = positions(totals.positionRates);
    }
    $("server-generation-tokens").textContent = String(totals.generationTokens);
    charts.update();
  }

  // ---- a request ----------------------------------------------------------------------------

  function readForm() {
    const mode = $("mode-completion").checked ? "completion" : "chat";
    const number = (id) => Number($(id).value);
    const body = {
      model: state.model,
      stream: true,
      stream_options: {include_usage: true},
      max_tokens: number("max-tokens"),
      temperature: number("temperature"),
      top_p: number("top-p"),
      spec_decode_token_origin: true,
    };
    if (number("top-k") > 0) body.top_k = number("top-k");
    if ($("seed").value.trim() !== "") body.seed = number("seed");
    if ($("ignore-eos").checked) body.ignore_eos = true;
    const prompt = $("prompt").value;
    if (mode === "chat") {
      body.messages = [{role: "user", content: prompt}];
      body.logprobs = true;
    } else {
      body.prompt = prompt;
      body.logprobs = 1;
    }
    return {path: mode === "chat" ? "/v1/chat/completions" : "/v1/completions", body};
  }

  async function generate() {
    if (state.controller) return;
    if (!state.model) await loadModel();
    if (!state.model) return;
    const {path, body} = readForm();
    resetRequest();
    const controller = new AbortController();
    state.controller = controller;
    setRunning(true, "streaming…");
    pollMetrics();
    try {
      const response = await api(path, {
        method: "POST", signal: controller.signal,
        headers: {"Content-Type": "application/json"}, body: JSON.stringify(body),
      });
      const finish = await readStream(response, onChunk);
      state.stats.finish();
      showRequest();
      setRunning(false, finish ? "done (" + finish + ")" : "done");
    } catch (err) {
      state.stats.finish();
      showRequest();
      if (err.name === "AbortError") {
        setRunning(false, "stopped");
      } else {
        setRunning(false, "failed");
        handleFailure(err, generate);
      }
    } finally {
      state.controller = null;
      pollMetrics();
    }
  }

  function stop() {
    if (state.controller) state.controller.abort();
  }

  function resetRequest() {
    showError("");
    state.stats = new Spec.RequestStats(state.server && state.server.hasSpec ? state.server.k : 0);
    state.final = null;
    state.firstTokenAt = null;
    state.lastTokenAt = null;
    $("output").textContent = "";
    $("reasoning").textContent = "";
    $("reasoning-box").hidden = true;
    state.inReasoning = false;
    $("request-note").textContent = "";
    showRequest();
  }

  function setRunning(running, label) {
    $("generate").disabled = running;
    $("stop").disabled = !running;
    $("status").textContent = label;
    $("status").dataset.state = running ? "running" : label.split(" ")[0];
  }

  // One chunk: its tokens (text and logprob from `logprobs`, origin, id and rejected guess
  // from the extension, all aligned) become spans in #output.
  function onChunk(payload) {
    let finish = null;
    for (const choice of payload.choices || []) {
      if (choice.index !== 0) continue;  // the page asks for one choice
      appendTokens(choice);
      finish = choice.finish_reason || finish;
    }
    const spec = payload.metrics && payload.metrics.speculative_decoding;
    if (spec) state.final = spec;
    return finish;
  }

  function appendTokens(choice) {
    const {texts, logprobs} = tokenTexts(choice);
    const origins = choice.spec_decode_token_origin;
    const ids = choice.spec_decode_token_ids || [];
    const rejected = choice.spec_decode_rejected_draft || [];
    const count = origins ? origins.length : texts.length;
    if (!count) return;
    if (!origins && !$("request-note").textContent) {
      $("request-note").textContent = "The server sent no spec_decode_token_origin: " +
        "token origins are unknown.";
    }
    const now = performance.now();
    if (state.firstTokenAt === null) state.firstTokenAt = now;
    state.lastTokenAt = now;
    const output = $("output");
    // Reasoning (with --reasoning-parser) goes to its own box above the answer.
    const delta = choice.delta || {};
    const reasoning = reasoningFlags(delta, Array.from({length: count}, (_, i) => texts[i] || ""),
                                     state.inReasoning);
    state.inReasoning = reasoning.length ? reasoning[reasoning.length - 1] : state.inReasoning;
    if (delta.content) state.inReasoning = false;
    if (reasoning.includes(true)) $("reasoning-box").hidden = false;
    // Follow the stream unless the reader has scrolled up to look at earlier tokens.
    const following = output.scrollTop + output.clientHeight >= output.scrollHeight - 8;
    for (let i = 0; i < count; i++) {
      // Without the extension, a server with no draft still has a known origin: the target.
      const origin = origins ? origins[i] : (state.server && !state.server.hasSpec ? "target" : "unknown");
      const guess = rejected[i] === undefined ? null : rejected[i];
      let mark = {kind: "plain", position: null};
      if (origins) mark = state.stats.add(origin, guess);
      else state.stats.tokens += 1;  // counted, but no acceptance without marks
      const {kind, position} = mark;
      (reasoning[i] ? $("reasoning") : output).appendChild(
        tokenSpan(texts[i] !== undefined ? texts[i] : "", origin, kind, position, ids[i],
                  logprobs[i], guess));
    }
    if (following) output.scrollTop = output.scrollHeight;
    showRequest();
  }

  // ---- figures ----------------------------------------------------------------------------

  function showRequest() {
    const s = state.stats;
    if (!s) return;
    const spec = s.k > 0 || s.steps > 0;
    // Once the response's own metrics arrive they are the exact figures (they also count
    // drafts proposed where the stream ended, e.g. past a stop token); until then, the marks'.
    const final = state.final;
    const rate = final ? final.draft_acceptance_rate : s.acceptanceRate;
    const length = final ? final.mean_acceptance_length : s.meanAcceptanceLength;
    $("acceptance-rate").textContent = spec || final ? percent(rate) : "n/a";
    $("mean-acceptance-length").textContent = spec || final ? fixed(length) : "n/a";
    $("acceptance-by-position").textContent = spec ? positions(s.positionRates()) : "n/a";
    $("tokens-generated").textContent = String(s.tokens);
    $("count-draft").textContent = String(s.draftTokens);
    $("count-target").textContent = String(s.targetTokens);
    $("verify-steps").textContent = String(final ? final.num_spec_steps : s.steps);
    const seconds = (state.lastTokenAt - state.firstTokenAt) / 1000;
    // Decode speed: tokens after the first over the time since the first (no prompt time).
    $("tokens-per-second").textContent = s.tokens > 1 && seconds > 0
      ? ((s.tokens - 1) / seconds).toFixed(1) : "–";
    if (final) {
      $("request-note").textContent = "final, from the response's metrics: " +
        final.num_accepted_draft_tokens + " of " + final.num_draft_tokens + " drafts accepted";
    }
    charts.update();
  }

  function percent(x) { return x === null || x === undefined ? "–" : (100 * x).toFixed(1) + " %"; }
  function fixed(x) { return x === null || x === undefined ? "–" : x.toFixed(2); }
  function positions(rates) {
    return rates.length ? rates.map((r, i) => (i + 1) + ": " + percent(r)).join(" · ") : "–";
  }

  const charts = TandemCharts.create(() => ({stats: state.stats, server: state.server}));

  // ---- hover: the token's origin, id, logprob and the draft's rejected guess ---------------

  function onHover(event) {
    const tip = $("token-tooltip");
    const span = event.target.closest ? event.target.closest(".tok") : null;
    if (!span || !(event.currentTarget.contains(span))) { tip.hidden = true; return; }
    tip.textContent = describe(span);
    tip.hidden = false;
    const box = span.getBoundingClientRect();
    tip.style.left = Math.min(window.scrollX + box.left, window.scrollX + window.innerWidth - 320) + "px";
    tip.style.top = (window.scrollY + box.bottom + 6) + "px";
  }

  // ---- wiring -----------------------------------------------------------------------------

  $("request-form").addEventListener("submit", (e) => { e.preventDefault(); generate(); });
  $("stop").addEventListener("click", stop);
  $("api-key-panel").addEventListener("submit", (e) => { e.preventDefault(); saveKey(); });
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) { e.preventDefault(); generate(); }
  });
  for (const id of ["output", "reasoning"]) {
    $(id).addEventListener("mouseover", onHover);
    $(id).addEventListener("mouseleave", () => { $("token-tooltip").hidden = true; });
  }
  loadModel();
  pollMetrics();
})();
