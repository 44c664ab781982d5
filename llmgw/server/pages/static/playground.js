// The playground: chat with a model through /v1, as a client would. The gateway key
// the user pastes lives only in this closure: it goes to /v1 in the Authorization
// header and nowhere else (never a page, never storage). Every word shown comes from
// the section's data- attributes (the template translates them); the model's text is
// added as text nodes, never as HTML.
(function () {
  "use strict";

  function $(id) { return document.getElementById(id); }

  function start() {
    var box = $("playground");
    if (!box || typeof fetch !== "function" || typeof AbortController !== "function") { return; }
    function say(name) { return box.getAttribute("data-" + name) || ""; }
    function fill(text, values) {
      return text.replace(/\{(\w+)\}/g, function (all, name) {
        return values[name] == null ? all : String(values[name]);
      });
    }

    var token = $("play-token"), model = $("play-model"), max = $("play-max");
    var status = $("play-status"), log = $("play-log"), input = $("play-input");
    var go = $("play-go"), stop = $("play-stop"), clear = $("play-clear");
    var figures = { prompt: $("play-prompt"), completion: $("play-completion"),
                    ttft: $("play-ttft"), rate: $("play-rate") };

    var key = "";          // the key the models were read with
    var asked = 0;         // which /v1/models answer is the latest
    var conversation = []; // {role, content}, as sent to /v1
    var running = null;    // the stream's AbortController, while one runs

    function tell(text, bad) {
      status.textContent = text;
      status.classList.toggle("error", !!bad);
    }

    function ready() {
      go.disabled = running !== null || !key || !model.value;
      stop.disabled = running === null;
    }

    // What /v1 said went wrong: its error.message (OpenAI's shape), else the status.
    function failure(answer) {
      return answer.text().then(function (body) {
        var message = answer.status + " " + answer.statusText;
        try {
          var read = JSON.parse(body);
          if (read && read.error && read.error.message) { message = read.error.message; }
        } catch (e) { /* not JSON: the status says it */ }
        return message;
      });
    }

    function headers() {
      return { "Authorization": "Bearer " + key, "Content-Type": "application/json" };
    }

    function models() {
      var wanted = token.value.trim();
      if (!wanted) { key = ""; model.textContent = ""; model.disabled = true; tell(say("no-key"), true); ready(); return; }
      key = wanted;
      var mine = ++asked;
      model.textContent = "";
      model.disabled = true;
      ready();
      tell(say("loading"), false);
      fetch("/v1/models", { headers: headers(), credentials: "omit", cache: "no-store" })
        .then(function (answer) {
          if (!answer.ok) {
            return failure(answer).then(function (message) { throw new Error(message); });
          }
          return answer.json();
        })
        .then(function (list) {
          if (mine !== asked) { return; }
          var names = (list.data || []).map(function (m) { return String(m.id); });
          names.forEach(function (name) {
            var option = document.createElement("option");
            option.value = name;
            option.textContent = name;
            model.appendChild(option);
          });
          model.disabled = names.length === 0;
          if (names.length === 0) { tell(say("no-models"), true); }
          else { tell(fill(say("models"), { n: names.length }), false); }
          ready();
        })
        .catch(function (error) {
          if (mine !== asked) { return; }
          key = "";
          tell(fill(say("failed"), { message: error.message }), true);
          ready();
        });
    }

    function message(role) {
      var el = document.createElement("div");
      el.className = "play-msg play-" + role;
      var who = document.createElement("span");
      who.className = "play-who";
      who.textContent = say(role === "user" ? "you" : "assistant");
      var text = document.createElement("p");
      text.className = "play-text";
      el.appendChild(who);
      el.appendChild(text);
      log.appendChild(el);
      return text;
    }

    function show(el, value) { el.textContent = value; }

    function reset() {
      Object.keys(figures).forEach(function (k) { show(figures[k], "—"); });
    }

    function finish(sent, first, last, usage) {
      var notRead = say("not-read");
      var prompt = usage && typeof usage.prompt_tokens === "number" ? usage.prompt_tokens : null;
      var completion = usage && typeof usage.completion_tokens === "number" ? usage.completion_tokens : null;
      show(figures.prompt, prompt === null ? notRead : String(prompt));
      show(figures.completion, completion === null ? notRead : String(completion));
      show(figures.ttft, first === null ? notRead : Math.round(first - sent) + " ms");
      var span = first === null ? 0 : (last - first) / 1000;
      var rate = completion === null || span <= 0 ? null : completion / span;
      show(figures.rate, rate === null ? notRead : rate >= 100 ? String(Math.round(rate)) : rate.toFixed(1));
    }

    function send() {
      var words = input.value;
      if (!words.trim() || running || !key || !model.value) { return; }
      conversation.push({ role: "user", content: words });
      message("user").appendChild(document.createTextNode(words));
      input.value = "";
      var out = message("assistant");
      var text = document.createTextNode("");
      out.appendChild(text);
      out.parentNode.classList.add("play-busy");
      log.scrollTop = log.scrollHeight;
      reset();

      var limit = parseInt(max.value, 10);
      var body = {
        model: model.value,
        messages: conversation.slice(),
        stream: true,
        stream_options: { include_usage: true },
      };
      if (limit > 0) { body.max_tokens = limit; }
      var control = new AbortController();
      running = control;
      ready();
      tell(say("streaming"), false);
      var sent = performance.now(), first = null, last = null, usage = null, broken = null;

      function take(line) {
        if (line.indexOf("data:") !== 0) { return false; } // comments keep the line alive
        var data = line.slice(5).trim();
        if (data === "[DONE]") { return true; }
        var chunk;
        try { chunk = JSON.parse(data); } catch (e) { return false; }
        if (chunk.error) { broken = chunk.error.message || String(chunk.error); return true; }
        if (chunk.usage) { usage = chunk.usage; }
        (chunk.choices || []).forEach(function (choice) {
          var piece = choice.delta && choice.delta.content;
          if (piece) {
            if (first === null) { first = performance.now(); }
            text.appendData(piece);
          }
        });
        return false;
      }

      fetch("/v1/chat/completions", {
        method: "POST", headers: headers(), body: JSON.stringify(body),
        signal: control.signal, credentials: "omit", cache: "no-store",
      })
        .then(function (answer) {
          if (!answer.ok) {
            return failure(answer).then(function (m) { broken = m; });
          }
          var reader = answer.body.getReader();
          var decoder = new TextDecoder();
          var held = "";
          function pump() {
            return reader.read().then(function (part) {
              if (part.done) { held += decoder.decode(); }
              else { held += decoder.decode(part.value, { stream: true }); }
              var lines = held.split(/\r?\n/);
              held = part.done ? "" : lines.pop();
              for (var i = 0; i < lines.length; i++) {
                if (take(lines[i])) { reader.cancel().catch(function () {}); return; }
              }
              log.scrollTop = log.scrollHeight;
              if (!part.done) { return pump(); }
            });
          }
          return pump();
        })
        .then(function () {
          last = performance.now();
          if (running !== control) { return; } // cleared meanwhile
          if (broken !== null) { tell(fill(say("failed"), { message: broken }), true); }
          else { tell(say("done"), false); }
        }, function (error) {
          last = performance.now();
          if (running !== control) { return; }
          if (control.signal.aborted) { tell(say("stopped"), false); }
          else { tell(fill(say("unreachable"), { message: error.message }), true); }
        })
        .then(function () {
          out.parentNode.classList.remove("play-busy");
          if (running !== control) { ready(); return; } // cleared: nothing to keep
          if (text.data) { conversation.push({ role: "assistant", content: text.data }); }
          else { conversation.pop(); } // no answer: the question leaves the conversation too
          finish(sent, first, last, usage);
          running = null;
          ready();
        });
    }

    document.getElementById("play-key").addEventListener("submit", function (e) {
      e.preventDefault();
      models();
    });
    token.addEventListener("change", function () { if (token.value.trim() !== key) { models(); } });
    model.addEventListener("change", ready);
    document.getElementById("play-send").addEventListener("submit", function (e) {
      e.preventDefault();
      send();
    });
    input.addEventListener("keydown", function (e) {
      if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) { e.preventDefault(); send(); }
    });
    stop.addEventListener("click", function () { if (running) { running.abort(); } });
    clear.addEventListener("click", function () {
      if (running) { var was = running; running = null; was.abort(); }
      conversation = [];
      log.textContent = "";
      reset();
      tell("", false);
      ready();
    });
    box.hidden = false;
    ready();
  }

  if (document.readyState === "loading") { document.addEventListener("DOMContentLoaded", start); }
  else { start(); }
})();
