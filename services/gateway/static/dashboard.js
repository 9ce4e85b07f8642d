// Rackscale dashboard: every NVLink domain as its grid of GPU cells (one row per node, as `rackscale cluster`
// draws them), the pending queue with reasons, and a job's placement, trace and last log lines on click.
// Data: GET /v1/cluster and /v1/jobs; every server-sent event of /v1/events triggers a (debounced) redraw, so
// what is shown is always the API's view. User strings only ever go into textContent or attributes. Behind a
// router over several scheduling cells (its answers name their cell) it shows one cell, ?cell= (default: the
// router's first), and a row of every cell's summary (GET /v1/cells) to pick another.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const JAEGER = document.querySelector('meta[name="rackscale-jaeger-ui"]').content;
  const OTHER_TENANT = "(other tenant)"; // services/gateway/views.py: another tenant's GPU, unnamed

  // A token arrives once as ?token=; it is kept for this tab only and dropped from the address bar.
  const params = new URLSearchParams(location.search);
  if (params.has("token")) {
    sessionStorage.setItem("rackscale-token", params.get("token"));
    params.delete("token");
    const rest = params.toString();
    history.replaceState(null, "", location.pathname + (rest ? "?" + rest : "") + location.hash);
  }
  const token = sessionStorage.getItem("rackscale-token");
  const cell = params.get("cell") || ""; // the scheduling cell shown, behind a router ("": its first)
  const inCell = (path) => (cell ? `${path}${path.includes("?") ? "&" : "?"}cell=${encodeURIComponent(cell)}` : path);
  let routed = false; // answers come through a router: they name their cell (X-Rackscale-Cell, services/router)
  const headers = token ? { Authorization: "Bearer " + token } : {};

  let selected = null; // the job whose details are shown
  const LOG_LINES = 20; // a selected job's last lines shown

  async function api(path) {
    const r = await fetch(path, { headers, cache: "no-store" });
    if (r.headers.has("X-Rackscale-Cell")) routed = true;
    if (!r.ok) {
      let why = `${r.status} ${r.statusText}`;
      try {
        why = (await r.json()).error || why;
      } catch (_) {
        // not JSON: keep the status line
      }
      const err = new Error(`${path}: ${why}`);
      err.status = r.status;
      throw err;
    }
    return r.json();
  }

  // A job's last lines (its processes' output); "" when there are none or they can't be read now.
  async function lastLines(id) {
    const r = await fetch(`/v1/jobs/${encodeURIComponent(id)}/logs?tail=${LOG_LINES}`, { headers, cache: "no-store" });
    return r.ok ? r.text() : "";
  }

  function el(tag, className, text) {
    const e = document.createElement(tag);
    if (className) e.className = className;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  // A stable colour per job id (FNV-1a, mixed): the same job has the same colour on every redraw and every screen.
  function colour(id) {
    let h = 2166136261;
    for (let i = 0; i < id.length; i++) h = Math.imul(h ^ id.charCodeAt(i), 16777619);
    h = Math.imul(h ^ (h >>> 16), 0x85ebca6b); // murmur3's finaliser: ids alike in their last bytes differ too
    h = Math.imul(h ^ (h >>> 13), 0xc2b2ae35);
    h = (h ^ (h >>> 16)) >>> 0;
    return `hsl(${h % 360} ${55 + ((h >>> 9) % 3) * 10}% ${38 + ((h >>> 11) % 3) * 8}%)`;
  }

  function showError(message) {
    $("error").hidden = !message;
    $("error").textContent = message || "";
    if (message && message.includes("401")) {
      $("error").textContent += " (open /dashboard?token=<your token>)";
    }
  }

  function drawCluster(view) {
    const panels = [];
    for (const d of view.domains) {
      const panel = el("section", "domain");
      panel.dataset.domain = d.name;
      const title = el("h3", "", d.name);
      const u = d.utilisation;
      title.append(el("small", "", `${u.busy}/${u.total} busy`));
      const grid = el("div", "grid");
      grid.style.setProperty("--gpus", Math.max(1, ...d.nodes.map((n) => n.gpus.length)));
      for (const n of d.nodes) {
        for (const g of n.gpus) {
          const cell = el("span", `gpu ${g.cell}`);
          cell.dataset.node = n.name;
          cell.dataset.gpu = g.index;
          let what = n.state === "up" ? g.health : `${n.state}${n.reason ? ": " + n.reason : ""}`;
          if (g.job === OTHER_TENANT) {
            cell.classList.add("other");
          } else if (g.job) {
            cell.dataset.job = g.job;
            cell.style.backgroundColor = colour(g.job);
            if (g.health !== "ok") cell.classList.add(`health-${g.health}`);
            if (n.state !== "up") cell.classList.add(`node-${n.state}`);
            if (g.job === selected) cell.classList.add("selected");
          }
          if (g.job) what = `job ${g.job}, ${what}`;
          cell.title = `${n.name} GPU ${g.index}: ${what}`;
          grid.append(cell);
        }
      }
      const troubled = d.nodes.filter((n) => n.state !== "up");
      const notes = el("ul", "troubled");
      for (const n of troubled) {
        const li = el("li", n.state, `${n.name} ${n.state}${n.reason ? " (" + n.reason + ")" : ""}`);
        li.dataset.node = n.name;
        notes.append(li);
      }
      panel.append(title, grid, notes);
      panels.push(panel);
    }
    $("domains").replaceChildren(...panels);
    const u = view.utilisation;
    $("summary").textContent = `${view.domains.length} NVLink domains · ${u.busy}/${u.total} GPUs busy`;
  }

  // One link per cell: its GPUs busy and jobs pending, or why it has no summary; the shown cell marked.
  function drawCells(list) {
    const shown = cell || (list.cells[0] && list.cells[0].cell);
    const links = list.cells.map((row) => {
      const s = row.summary;
      const figures = s ? `${s.busy}/${s.gpus} GPUs busy · ${s.jobs_pending} pending` : "down";
      const text = `${row.cell} · ${figures}`;
      const a = el("a", `${row.cell === shown ? "current" : ""} ${row.up ? "" : "down"}`.trim(), text);
      a.href = `?cell=${encodeURIComponent(row.cell)}`;
      a.dataset.cell = row.cell;
      if (row.error) a.title = row.error;
      return a;
    });
    $("cells").replaceChildren(...links);
    $("cells").hidden = false;
  }

  function drawPending(list) {
    const rows = list.jobs.map((j) => {
      const li = el("li", j.id === selected ? "selected" : "");
      li.dataset.job = j.id;
      li.append(el("strong", "name", j.name), ` ${j.tenant} · ${j.gpus} GPUs`, el("span", "reason", j.reason || "…"));
      return li;
    });
    $("pending").replaceChildren(...rows);
    $("pending-count").textContent = `(${list.total})`;
  }

  function drawDetails(job) {
    $("details").hidden = false;
    $("details").dataset.job = job.id;
    $("d-name").textContent = job.name;
    $("d-id").textContent = job.id;
    $("d-tenant").textContent = job.tenant;
    $("d-state").textContent = job.state;
    $("d-gpus").textContent = String(job.gpus);
    $("d-reason").textContent = job.reason || "—";
    const rows = job.allocation.map((p) => {
      const tr = el("tr");
      tr.append(el("td", "", p.domain), el("td", "", p.node), el("td", "", p.gpus.join(",")));
      return tr;
    });
    $("d-placement").tBodies[0].replaceChildren(...rows);
    $("d-placement").hidden = rows.length === 0;
    $("d-unplaced").hidden = rows.length > 0;
    const link = $("d-trace");
    link.hidden = !job.trace_id;
    if (job.trace_id) link.href = `${JAEGER}/trace/${encodeURIComponent(job.trace_id)}`;
    else link.removeAttribute("href");
  }

  function drawLogs(text) {
    $("d-logs").textContent = text || "no output";
    $("d-logs").classList.toggle("empty", !text);
  }

  function markSelected() {
    for (const e of document.querySelectorAll(".selected")) e.classList.remove("selected");
    if (!selected) return;
    for (const e of document.querySelectorAll("[data-job]")) {
      if (e.dataset.job === selected && e.closest("#domains, #pending")) e.classList.add("selected");
    }
  }

  async function select(id) {
    selected = id;
    markSelected();
    try {
      const [job, text] = await Promise.all([api(`/v1/jobs/${encodeURIComponent(id)}`), lastLines(id)]);
      drawDetails(job);
      drawLogs(text);
    } catch (e) {
      showError(e.message);
    }
  }

  // Redraws: at most one in flight and one per MIN_GAP_MS (a busy cluster sends hundreds of events a second;
  // each redraw reads the whole cluster view); events arriving meanwhile ask for one more.
  const MIN_GAP_MS = 500;
  let timer = null;
  let running = false;
  let again = false;
  let lastStart = -Infinity;

  function schedule() {
    if (timer === null) {
      const wait = Math.max(50, lastStart + MIN_GAP_MS - performance.now());
      timer = setTimeout(() => {
        timer = null;
        refresh();
      }, wait);
    }
  }

  async function refresh() {
    if (running) {
      again = true;
      return;
    }
    running = true;
    lastStart = performance.now();
    try {
      const [cluster, pending] = await Promise.all([
        api(inCell("/v1/cluster")),
        api(inCell("/v1/jobs?state=pending&limit=500")),
      ]);
      drawCluster(cluster);
      drawPending(pending);
      if (routed) drawCells(await api("/v1/cells"));
      if (selected) {
        try {
          const [job, text] = await Promise.all([api(`/v1/jobs/${encodeURIComponent(selected)}`), lastLines(selected)]);
          drawDetails(job);
          drawLogs(text);
        } catch (e) {
          if (e.status !== 404) throw e;
          selected = null;
          $("details").hidden = true;
        }
      }
      showError("");
    } catch (e) {
      showError(e.message);
    } finally {
      running = false;
      if (again) {
        again = false;
        schedule();
      }
    }
  }

  function setLive(on) {
    $("live").dataset.live = on ? "1" : "0";
    $("live").textContent = on ? "live" : "reconnecting…";
  }

  function connect() {
    const es = new EventSource("/v1/events" + (token ? `?token=${encodeURIComponent(token)}` : ""));
    es.onopen = () => {
      setLive(true);
      schedule(); // events may have been missed while (re)connecting
    };
    es.onerror = () => {
      setLive(false);
      if (es.readyState === EventSource.CLOSED) setTimeout(connect, 5000); // a refused stream isn't retried by itself
    };
    es.addEventListener("job", schedule);
    es.addEventListener("node", schedule);
    es.addEventListener("cluster", schedule); // another tenant's job moved: only the cluster view changed
  }

  function clicked(ev) {
    const target = ev.target.closest("[data-job]");
    if (target) select(target.dataset.job);
  }

  $("domains").addEventListener("click", clicked);
  $("pending").addEventListener("click", clicked);
  refresh();
  connect();
})();
