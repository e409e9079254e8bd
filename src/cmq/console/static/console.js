// The cmq console's pages: each polls the JSON API at most once a second and
// redraws in place. Plain script, no build step; charts by the vendored uPlot.
// Everything from the server is put in the page as text, never as HTML.
"use strict";
(function () {
  const body = document.body;
  const P = body.dataset.prefix;
  const KIND = body.dataset.kind;
  const CSRF = document.querySelector('meta[name="csrf-token"]').content;
  const INTERVAL = 1000;
  const $ = (sel) => document.querySelector(sel);

  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }
  function fmt(v, digits) {
    if (v === null || v === undefined) return "–";
    if (typeof v === "number") {
      if (digits !== undefined) return v.toFixed(digits);
      return Number.isInteger(v) ? v.toLocaleString("en") : v.toFixed(1);
    }
    if (typeof v === "boolean") return v ? "yes" : "no";
    if (typeof v === "object") return JSON.stringify(v);
    return String(v);
  }
  function duration(s) {
    const d = Math.floor(s / 86400), h = Math.floor(s / 3600) % 24, m = Math.floor(s / 60) % 60;
    return (d ? d + "d " : "") + (d || h ? h + "h " : "") + m + "m " + Math.floor(s % 60) + "s";
  }
  async function api(path, options) {
    const opts = Object.assign({ credentials: "same-origin", headers: {} }, options || {});
    if (opts.method && opts.method !== "GET") {
      opts.headers["X-CSRF-Token"] = CSRF;
      opts.headers["Content-Type"] = "application/json";
    }
    const r = await fetch(P + "/api/" + path, opts);
    let data = null;
    try { data = await r.json(); } catch (e) { data = { error: r.statusText }; }
    if (!r.ok) throw new Error((data && data.error) || ("HTTP " + r.status));
    return data;
  }
  function live(ok, text) {
    const l = $("#live");
    l.classList.toggle("down", !ok);
    l.textContent = ok ? "live" : "offline";
    l.title = ok ? "updated once a second" : text;
  }
  // Runs fn now and then every INTERVAL, never two at once, not while hidden.
  function poll(fn) {
    let busy = false;
    async function tick() {
      if (busy || document.hidden) return;
      busy = true;
      try { await fn(); live(true); } catch (e) { live(false, e.message); }
      finally { busy = false; }
    }
    tick();
    setInterval(tick, INTERVAL);
    return tick;
  }
  function kvTable(table, pairs) {
    const tb = table.tBodies[0];
    tb.replaceChildren(...pairs.map(([k, v]) => {
      const tr = el("tr");
      tr.append(el("th", k), el("td", fmt(v)));
      return tr;
    }));
  }
  function chart(target, labels, colors) {
    const width = () => Math.max(240, target.clientWidth - 4);
    const series = [{}].concat(labels.map((label, i) => ({ label, stroke: colors[i], width: 2 })));
    const empty = [[]].concat(labels.map(() => []));
    const u = new uPlot({ width: width(), height: 220, series, scales: { x: { time: true } },
      axes: [{}, { size: 60 }], legend: { live: false } }, empty, target);
    window.addEventListener("resize", () => u.setSize({ width: width(), height: 220 }));
    return u;
  }
  function status(text, bad) {
    const s = $("#action-status");
    s.textContent = text;
    s.classList.toggle("bad", !!bad);
  }

  // -- overview ------------------------------------------------------------
  function overview() {
    const c = chart($("#rate-chart"), ["in/s", "out/s", KIND === "service" ? "deletes/s" : "acks/s"],
      ["#2563eb", "#16a34a", "#d97706"]);
    poll(async () => {
      const o = await api("overview");
      const r = o.rates || {};
      $("#rate-in").textContent = fmt(r.in, 1);
      $("#rate-out").textContent = fmt(r.out, 1);
      $("#rate-ack").textContent = fmt(r.ack, 1);
      $("#queue-count").textContent = fmt(o.queues);
      $("#exchange-count").textContent = o.exchanges !== undefined ? o.exchanges + " exchanges" : "";
      $("#clients").textContent = KIND === "service" ? fmt(o.totals.requests) : fmt(o.clients);
      kvTable($("#totals"), Object.entries(o.totals));
      const server = [["kind", o.kind], ["version", o.version], ["uptime", duration(o.uptime)],
        ["store", o.store], ["health", o.health]];
      if (o.listen) server.push(["listening", o.listen]);
      kvTable($("#server"), server);
      const h = o.history;
      c.setData([h.t, h.in || [], h.out || [], h.ack || []]);
    });
  }

  // -- the queue table -------------------------------------------------------
  function queues() {
    const state = { sort: "name", order: "asc", page: 1, per_page: 50, filter: "" };
    const tb = $("#queue-table").tBodies[0];
    const heads = document.querySelectorAll("#queue-table th[data-sort]");
    const cols = KIND === "service" ? ["depth", "in_flight", "delayed", "rate_in", "rate_out"]
                                    : ["depth", "in_flight", "consumers", "rate_in", "rate_out"];
    let pages = 1;
    const tick = poll(async () => {
      const q = new URLSearchParams({ sort: state.sort, order: state.order, page: state.page,
        per_page: state.per_page, filter: state.filter });
      const d = await api("queues?" + q);
      pages = d.pages;
      state.page = d.page;
      tb.replaceChildren(...d.rows.map((row) => {
        const tr = el("tr");
        tr.dataset.queue = row.name;
        const name = el("td");
        const a = el("a", row.name);
        a.href = P + "/queues/" + encodeURIComponent(row.name);
        name.append(a);
        tr.append(name);
        for (const k of cols) tr.append(el("td", fmt(row[k], k.startsWith("rate") && row[k] !== null ? 1 : undefined), "num"));
        return tr;
      }));
      if (!d.rows.length) {
        const tr = el("tr");
        const td = el("td", d.total ? "No queue on this page." : "No queues" + (state.filter ? " match." : " yet."), "muted");
        td.colSpan = 6;
        tr.append(td);
        tb.append(tr);
      }
      $("#queue-total").textContent = d.total.toLocaleString("en") + " queue" + (d.total === 1 ? "" : "s");
      $("#page-of").textContent = "page " + d.page + " of " + d.pages;
      $("#prev-page").disabled = d.page <= 1;
      $("#next-page").disabled = d.page >= d.pages;
    });
    let typing;
    $("#queue-filter").addEventListener("input", (e) => {
      clearTimeout(typing);
      typing = setTimeout(() => { state.filter = e.target.value; state.page = 1; tick(); }, 200);
    });
    $("#per-page").addEventListener("change", (e) => { state.per_page = +e.target.value; state.page = 1; tick(); });
    $("#prev-page").addEventListener("click", () => { if (state.page > 1) { state.page--; tick(); } });
    $("#next-page").addEventListener("click", () => { if (state.page < pages) { state.page++; tick(); } });
    heads.forEach((th) => th.addEventListener("click", () => {
      const key = th.dataset.sort;
      state.order = state.sort === key && state.order === "asc" ? "desc" : (state.sort === key ? "asc" : (key === "name" ? "asc" : "desc"));
      state.sort = key;
      state.page = 1;
      heads.forEach((h) => h.removeAttribute("aria-sort"));
      th.setAttribute("aria-sort", state.order === "asc" ? "ascending" : "descending");
      tick();
    }));
  }

  // -- one queue --------------------------------------------------------------
  function queue() {
    const name = body.dataset.name;
    const path = encodeURIComponent(name);
    const c = chart($("#depth-chart"), ["ready", KIND === "service" ? "in flight" : "unacked"], ["#2563eb", "#d97706"]);
    const hist = [[], [], []];
    const HOLD = 300;
    const tick = poll(async () => {
      const q = await api("queue/" + path);
      const row = q.row || {};
      $("#depth").textContent = fmt(row.depth);
      $("#in-flight").textContent = fmt(row.in_flight);
      if (KIND === "service") $("#delayed").textContent = fmt(row.delayed);
      else $("#consumers").textContent = fmt(row.consumers);
      $("#rates").textContent = fmt(row.rate_in, 1) + " / " + fmt(row.rate_out, 1);
      kvTable($("#attributes"), Object.entries(q.attributes));
      if (q.bindings) {
        $("#bindings").tBodies[0].replaceChildren(...q.bindings.map((b) => {
          const tr = el("tr");
          tr.append(el("td", b.exchange === "" ? "(default)" : b.exchange), el("td", b.key));
          return tr;
        }));
      }
      const sources = q.dead_letter_sources || [];
      $("#dlq").hidden = !sources.length;
      $("#dlq-sources").replaceChildren(...sources.map((s) => el("li", s)));
      $("#redrive-button").hidden = !q.can_redrive;
      hist[0].push(Date.now() / 1000); hist[1].push(row.depth || 0); hist[2].push(row.in_flight || 0);
      if (hist[0].length > HOLD) hist.forEach((a) => a.shift());
      c.setData(hist);
    });
    async function act(what, fn) {
      status(what + "…");
      try { status(await fn()); } catch (e) { status(what + " failed: " + e.message, true); }
      tick();
    }
    $("#send-form").addEventListener("submit", (e) => {
      e.preventDefault();
      const text = $("#send-body").value;
      act("Sending", async () => {
        const r = await api("send/" + path, { method: "POST", body: JSON.stringify({ body: text }) });
        return r.message_id ? "Sent message " + r.message_id + "." : "Sent (routed to " + r.routed + " queue).";
      });
    });
    $("#purge-button").addEventListener("click", () => { $("#purge-confirm").hidden = false; $("#purge-yes").focus(); });
    $("#purge-no").addEventListener("click", () => { $("#purge-confirm").hidden = true; });
    $("#purge-yes").addEventListener("click", () => {
      $("#purge-confirm").hidden = true;
      act("Purging", async () => {
        const r = await api("purge/" + path, { method: "POST", body: "{}" });
        return r.messages !== undefined ? "Purged " + r.messages + " messages." : "Purged.";
      });
    });
    $("#redrive-button").addEventListener("click", () => act("Redriving", async () => {
      const r = await api("redrive/" + path, { method: "POST", body: "{}" });
      return "Moving the messages back to their source queues (task " + r.task + ").";
    }));
    $("#peek-button").addEventListener("click", async () => {
      try {
        const r = await api("peek/" + path + "?n=" + $("#peek-count").value);
        showPeek(r.messages);
      } catch (e) { status("Peek failed: " + e.message, true); }
    });
  }
  function showPeek(messages) {
    const t = $("#peek-table");
    const cols = KIND === "service"
      ? [["id", "Message id"], ["state", "State"], ["receive_count", "Received"], ["sent", "Sent"], ["body", "Body"]]
      : [["routing_key", "Routing key"], ["exchange", "Exchange"], ["redelivered", "Redelivered"], ["body", "Body"]];
    const head = el("tr");
    head.append(...cols.map(([, label]) => el("th", label)));
    t.tHead.replaceChildren(head);
    t.tBodies[0].replaceChildren(...messages.map((m) => {
      const tr = el("tr");
      for (const [k] of cols) {
        let v = m[k];
        if (k === "sent" && v) v = new Date(v).toISOString().replace("T", " ").slice(0, 19);
        if (k === "body" && m.truncated) v += " …";
        tr.append(el("td", k === "exchange" && v === "" ? "(default)" : fmt(v), k === "body" ? "body" : ""));
      }
      return tr;
    }));
    if (!messages.length) {
      const tr = el("tr");
      const td = el("td", "The queue holds no messages.", "muted");
      td.colSpan = cols.length;
      tr.append(td);
      t.tBodies[0].append(tr);
    }
  }

  // -- exchanges ----------------------------------------------------------------
  function exchanges() {
    const select = $("#route-exchange");
    poll(async () => {
      const d = await api("exchanges");
      const names = d.exchanges.map((e) => e.name);
      const known = Array.from(select.options).map((o) => o.value);
      if (names.join("\n") !== known.join("\n")) {
        const chosen = select.value;
        select.replaceChildren(...names.map((n) => { const o = el("option", n === "" ? "(default)" : n); o.value = n; return o; }));
        if (names.includes(chosen)) select.value = chosen;
      }
      $("#exchange-table").tBodies[0].replaceChildren(...d.exchanges.map((e) => {
        const tr = el("tr");
        tr.dataset.exchange = e.name;
        const b = el("td");
        const list = el("ul", null, "bindings");
        const shown = e.name === "" ? [] : e.bindings;
        list.append(...shown.map((x) => el("li", x.queue + " ← " + (x.key === "" ? "(empty key)" : x.key))));
        if (e.name === "") list.append(el("li", "every queue, by its name", "muted"));
        else if (!shown.length) list.append(el("li", "none", "muted"));
        b.append(list);
        tr.append(el("td", e.name === "" ? "(default)" : e.name), el("td", e.type), el("td", fmt(e.durable)), b);
        return tr;
      }));
    });
    $("#route-form").addEventListener("submit", async (e) => {
      e.preventDefault();
      const out = $("#route-result");
      try {
        const q = new URLSearchParams({ exchange: select.value, key: $("#route-key").value });
        const r = await api("route?" + q);
        out.classList.remove("bad");
        out.textContent = r.queues.length ? "Reaches " + r.queues.length + " queue" + (r.queues.length === 1 ? "" : "s") + ": " + r.queues.join(", ")
                                          : "Reaches no queue (unroutable).";
      } catch (err) { out.classList.add("bad"); out.textContent = err.message; }
    });
  }

  ({ overview, queues, queue, exchanges })[body.dataset.page]();
})();
