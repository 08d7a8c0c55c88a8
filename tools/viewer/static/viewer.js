"use strict";
// The page: one WebSocket; the server sends the latest state of the visible area, the page draws it.
const canvas = document.getElementById("canvas"), ctx = canvas.getContext("2d");
const $ = (id) => document.getElementById(id);
let worlds = [], world = null, axes = [0, 1], state = null;
let view = { cx: 0, cy: 0, scale: 1 };          // world point at the canvas centre, pixels per unit
let drag = null, queryRect = null;
const ws = new WebSocket((location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/ws");
window.sapgridViewer = { get state() { return state; }, lastQuery: null, lastPick: null, toWorld, toScreen };

function resize() { canvas.width = canvas.clientWidth; canvas.height = canvas.clientHeight; draw(); }
function toScreen(x, y) { return [(x - view.cx) * view.scale + canvas.width / 2, canvas.height / 2 - (y - view.cy) * view.scale]; }
function toWorld(px, py) { return [(px - canvas.width / 2) / view.scale + view.cx, (canvas.height / 2 - py) / view.scale + view.cy]; }
function visibleRect() { const [x0, y0] = toWorld(0, canvas.height), [x1, y1] = toWorld(canvas.width, 0); return [x0, y0, x1, y1]; }

function fit() {
  if (!world) return;
  const d = world.dims, b = world.bounds, [a0, a1] = axes;
  const w = b[d + a0] - b[a0], h = b[d + a1] - b[a1];
  view.cx = (b[a0] + b[d + a0]) / 2; view.cy = (b[a1] + b[d + a1]) / 2;
  view.scale = 0.95 * Math.min(canvas.width / w, canvas.height / h);
  sendView();
}
function sendView() {
  if (world && ws.readyState === 1) ws.send(JSON.stringify({ type: "view", world: world.name, axes, rect: visibleRect() }));
}

async function loadWorlds() {
  const r = await (await fetch("/api/worlds")).json();
  if (r.error) { $("status").textContent = `server: ${r.error}`; return; }
  worlds = r.worlds;
  const sel = $("world"); sel.innerHTML = "";
  for (const w of worlds) sel.add(new Option(`${w.name} (${w.dims}D)`, w.name));
  const pick = worlds.find((w) => w.name === r.default) || worlds[0];
  if (pick) { sel.value = pick.name; chooseWorld(pick.name); } else $("status").textContent = "no worlds on the server";
}
function chooseWorld(name) {
  world = worlds.find((w) => w.name === name); axes = [0, 1];
  const as = $("axes"); as.innerHTML = "";
  const names = "xyz";
  for (let i = 0; i < world.dims; i++) for (let j = 0; j < world.dims; j++)
    if (i < j) as.add(new Option(names[i] + names[j], i + "," + j));
  fit();
}

function draw() {
  ctx.fillStyle = "#0b0d12"; ctx.fillRect(0, 0, canvas.width, canvas.height);
  if (!world) return;
  const d = world.dims, b = world.bounds, [a0, a1] = axes;
  // grid cells
  ctx.strokeStyle = "#1f2633"; ctx.lineWidth = 1; ctx.beginPath();
  const nx = world.cells[a0], ny = world.cells[a1];
  if (nx * view.scale * (b[d + a0] - b[a0]) / nx > 3) for (let i = 0; i <= nx; i++) {
    const x = b[a0] + (b[d + a0] - b[a0]) * i / nx, [p0, q0] = toScreen(x, b[a1]), [p1, q1] = toScreen(x, b[d + a1]);
    ctx.moveTo(p0, q0); ctx.lineTo(p1, q1);
  }
  if (view.scale * (b[d + a1] - b[a1]) / ny > 3) for (let j = 0; j <= ny; j++) {
    const y = b[a1] + (b[d + a1] - b[a1]) * j / ny, [p0, q0] = toScreen(b[a0], y), [p1, q1] = toScreen(b[d + a0], y);
    ctx.moveTo(p0, q0); ctx.lineTo(p1, q1);
  }
  ctx.stroke();
  if (!state) return;
  const bx = state.boxes, n = state.sent;
  const inPair = new Uint8Array(n);
  for (const i of state.pairs) inPair[i] = 1;
  const rect = (i) => { const [p0, q0] = toScreen(bx[4 * i], bx[4 * i + 3]), [p1, q1] = toScreen(bx[4 * i + 2], bx[4 * i + 1]);
    return [p0, q0, Math.max(1, p1 - p0), Math.max(1, q1 - q0)]; };
  ctx.lineWidth = 1;
  ctx.fillStyle = "rgba(90,140,220,0.18)"; ctx.strokeStyle = "rgba(110,160,240,0.7)";
  ctx.beginPath(); for (let i = 0; i < n; i++) if (!inPair[i]) ctx.rect(...rect(i)); ctx.fill(); ctx.stroke();
  ctx.fillStyle = "rgba(255,170,40,0.30)"; ctx.strokeStyle = "rgba(255,180,60,0.95)";
  ctx.beginPath(); for (let i = 0; i < n; i++) if (inPair[i]) ctx.rect(...rect(i)); ctx.fill(); ctx.stroke();
  const centre = (i) => toScreen((bx[4 * i] + bx[4 * i + 2]) / 2, (bx[4 * i + 1] + bx[4 * i + 3]) / 2);
  const lines = (segs, style, width) => {
    ctx.strokeStyle = style; ctx.lineWidth = width; ctx.beginPath();
    for (let k = 0; k < segs.length; k += 2) { const [p, q] = centre(segs[k]), [r, s] = centre(segs[k + 1]); ctx.moveTo(p, q); ctx.lineTo(r, s); }
    ctx.stroke();
  };
  lines(state.pairs, "rgba(255,120,40,0.8)", 1);
  lines(state.created, "rgba(80,255,120,1)", 3);   // just started overlapping
  lines(state.deleted, "rgba(255,60,200,1)", 3);   // just stopped overlapping
  if (queryRect) {
    const [p0, q0] = toScreen(queryRect[0], queryRect[3]), [p1, q1] = toScreen(queryRect[2], queryRect[1]);
    ctx.strokeStyle = "#fff"; ctx.setLineDash([4, 3]); ctx.lineWidth = 1; ctx.strokeRect(p0, q0, p1 - p0, q1 - q0); ctx.setLineDash([]);
  }
}

ws.onopen = loadWorlds;
ws.onmessage = (ev) => {
  const m = JSON.parse(ev.data);
  if (m.type === "state") {
    state = m; draw();
    const s = m.stats || {};
    $("stats").textContent = `frame ${s.frame ?? "-"}  objects ${s.objects ?? "-"}  pairs ${s.pairs ?? "-"}  +${s.created ?? 0} -${s.deleted ?? 0}` +
      `  engine ${(s.engine_ms ?? 0).toFixed(2)} ms  ${(s.fps ?? 0).toFixed(1)} frames/s  shown ${m.sent}/${m.total}`;
    $("status").textContent = m.error || "";
    canvas.dataset.boxes = m.sent; canvas.dataset.pairs = m.pairs.length / 2;
  } else if (m.type === "query") {
    window.sapgridViewer.lastQuery = m;
    $("query").textContent = `${m.count} ids: ${m.ids.join(", ")}`;
  } else if (m.type === "pick") {
    window.sapgridViewer.lastPick = m;
    $("pick").textContent = m.id === null ? "nothing here" : `id ${m.id}\nbox ${m.box.map((v) => v.toFixed(2)).join(", ")}\npairs ${m.pairs.join(", ") || "none"}`;
  } else if (m.type === "error") {
    $("status").textContent = m.message;
  }
};

canvas.addEventListener("mousedown", (e) => { drag = { x: e.offsetX, y: e.offsetY, cx: view.cx, cy: view.cy, query: e.shiftKey, moved: false }; });
canvas.addEventListener("mousemove", (e) => {
  if (!drag) return;
  if (Math.abs(e.offsetX - drag.x) + Math.abs(e.offsetY - drag.y) > 3) drag.moved = true;
  if (drag.query) {
    const [x0, y0] = toWorld(drag.x, drag.y), [x1, y1] = toWorld(e.offsetX, e.offsetY);
    queryRect = [Math.min(x0, x1), Math.min(y0, y1), Math.max(x0, x1), Math.max(y0, y1)];
  } else {
    view.cx = drag.cx - (e.offsetX - drag.x) / view.scale; view.cy = drag.cy + (e.offsetY - drag.y) / view.scale;
  }
  draw();
});
canvas.addEventListener("mouseup", (e) => {
  if (!drag) return;
  if (drag.query && queryRect) ws.send(JSON.stringify({ type: "query", rect: queryRect }));
  else if (!drag.moved) { const [x, y] = toWorld(e.offsetX, e.offsetY); ws.send(JSON.stringify({ type: "pick", x, y, r: 2 / view.scale })); }
  else sendView();
  drag = null;
});
canvas.addEventListener("wheel", (e) => {
  e.preventDefault();
  const [wx, wy] = toWorld(e.offsetX, e.offsetY), f = Math.exp(-e.deltaY * 0.001);
  view.scale *= f; view.cx = wx - (wx - view.cx) / f; view.cy = wy - (wy - view.cy) / f;
  draw(); sendView();
}, { passive: false });
$("world").onchange = (e) => chooseWorld(e.target.value);
$("axes").onchange = (e) => { axes = e.target.value.split(",").map(Number); fit(); };
$("fit").onclick = fit;
window.addEventListener("resize", () => { resize(); sendView(); });
resize();
