// The page's access to the public API, no DOM: fetch with the API key (an error status becomes
// an ApiError carrying the server's message) and the SSE reader of a streamed response.
// Exposed as window.TandemApi.
(function (root) {
  "use strict";

  class ApiError extends Error {
    constructor(message, status) { super(message); this.status = status; }
  }

  // fetch `path` with the key (if any); resolves to the response, or rejects with an ApiError.
  async function request(path, init, apiKey) {
    const headers = Object.assign({}, (init && init.headers) || {});
    if (apiKey) headers["Authorization"] = "Bearer " + apiKey;
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

  // Reads the SSE stream, calling handle per JSON event; returns the last finish_reason that
  // handle returned. An error event (the server's sse_error) becomes an ApiError.
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

  root.TandemApi = {ApiError, request, readStream};
})(window);
