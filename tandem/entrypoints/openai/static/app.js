// The page's behaviour: send the prompt through the public API with the
// `spec_decode_token_origin` extension, render each streamed token with its origin, and keep the
// request's and the server's figures (and the two charts) current. Model text only ever reaches
// the page through textContent, never as HTML.
(function () {
  "use strict";

  const $ = (id) => document.getElementById(id);
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
  };

  // ---- API access -------------------------------------------------------------------------

  function readStoredKey() {
    try { return localStorage.getItem(KEY_STORAGE) || ""; } catch (e) { return ""; }
  }

  class ApiError extends Error {
    constructor(message, status) { super(message); this.status = status; }
  }

  // fetch with the key; an error status becomes an ApiError carrying the server's message.
  async function api(path, init) {
    const headers = Object.assign({}, (init && init.headers) || {});
    if (state.apiKey) headers["Authorization"] = "Bearer " + state.apiKey;
    const response = await fetch(path, Object.assign({}, init, {headers}));
    if (!response.ok) {
      throw new ApiError(await errorMessage(response), response.status);
    }
    return response;
  }

  // OpenAI's error shape {"error": {"message"}}, else whatever text came back.
  async function errorMessage(response) {
    const text = await response.text();
    try {
      const body = JSON.parse(text);
      if (body && body.error && body.error.message) return body.error.message;
    } catch (e) { /* not JSON */ }
    return text || response.statusText;
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

  // Reads the SSE stream, calling onChunk per JSON event; returns the last finish_reason.
  // An error event (the server's sse_error) becomes an ApiError.
  async function readStream(response, handle) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    let finish = null;
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, {stream: true});
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        for (const line of event.split("\n")) {
          if (!line.startsWith("data:")) continue;
          const data = line.slice(5).trim();
          if (data === "[DONE]") return finish;
          const payload = JSON.parse(data);
          if (payload.error) {
            throw new ApiError(payload.error.message || "error in the stream",
                               payload.error.code || 500);
          }
          finish = handle(payload) || finish;
        }
      }
    }
    return finish;
  }

  function resetRequest() {
    showError("");
    state.stats = new Spec.RequestStats(state.server && state.server.hasSpec ? state.server.k : 0);
    state.final = null;
    state.firstTokenAt = null;
    state.lastTokenAt = null;
    $("output").textContent = "";
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
      output.appendChild(tokenSpan(texts[i] !== undefined ? texts[i] : "", origin, kind, position,
                                   ids[i], logprobs[i], guess));
    }
    if (following) output.scrollTop = output.scrollHeight;
    showRequest();
  }

  // Token texts and logprobs in either response format.
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

  // ---- charts (Chart.js, vendored; the page works without them) -----------------------------

  const charts = (function () {
    if (typeof Chart === "undefined") return {update() {}};
    Chart.defaults.font.size = 11;
    const common = {animation: false, responsive: true, maintainAspectRatio: false};
    const percentAxis = {min: 0, max: 100, ticks: {callback: (v) => v + "%"}};
    const byPosition = new Chart($("chart-position"), {
      type: "bar",
      data: {labels: [], datasets: [
        {label: "this request", data: [], backgroundColor: "#3fa66b"},
        {label: "server total", data: [], backgroundColor: "#8c9bb5"},
      ]},
      options: Object.assign({}, common, {scales: {y: percentAxis,
        x: {title: {display: true, text: "draft position"}}}}),
    });
    const overTime = new Chart($("chart-time"), {
      type: "line",
      data: {labels: [], datasets: [
        {label: "cumulative", data: [], borderColor: "#2f6fd6", pointRadius: 0, borderWidth: 2},
        {label: "last 8 steps", data: [], borderColor: "#e08a2c", pointRadius: 0, borderWidth: 1.5},
      ]},
      options: Object.assign({}, common, {scales: {y: percentAxis,
        x: {title: {display: true, text: "verify step"}, ticks: {maxTicksLimit: 8}}}}),
    });
    let pending = false;
    function draw() {
      pending = false;
      const s = state.stats;
      const server = state.server && state.server.hasSpec ? state.server.positionRates : [];
      const mine = s ? s.positionRates() : [];
      const n = Math.max(server.length, mine.length);
      byPosition.data.labels = Array.from({length: n}, (_, i) => String(i + 1));
      byPosition.data.datasets[0].data = Array.from({length: n}, (_, i) => pct(mine[i]));
      byPosition.data.datasets[1].data = Array.from({length: n}, (_, i) => pct(server[i]));
      byPosition.update();
      const steps = s ? s.timeline : [];
      overTime.data.labels = steps.map((t) => t.step);
      overTime.data.datasets[0].data = steps.map((t) => pct(t.rate));
      overTime.data.datasets[1].data = steps.map((t) => pct(t.windowRate));
      overTime.update();
    }
    function pct(x) { return x === null || x === undefined ? null : 100 * x; }
    // At most one redraw per frame however many tokens arrive.
    return {update() { if (!pending) { pending = true; requestAnimationFrame(draw); } }};
  })();

  // ---- hover: the token's origin, id, logprob and the draft's rejected guess ---------------

  function describe(span) {
    const d = span.dataset;
    const lines = [];
    const what = {
      accepted: "draft token, accepted by the target (draft position " + (Number(d.position) + 1) + ")",
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

  function onHover(event) {
    const tip = $("token-tooltip");
    const span = event.target.closest ? event.target.closest(".tok") : null;
    if (!span || !$("output").contains(span)) { tip.hidden = true; return; }
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
  $("output").addEventListener("mouseover", onHover);
  $("output").addEventListener("mouseleave", () => { $("token-tooltip").hidden = true; });
  loadModel();
  pollMetrics();
})();
