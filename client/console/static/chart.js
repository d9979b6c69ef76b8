// A time-series line chart in SVG: [[t_ms, value], ...] in, an <svg> out. No dependencies.
// The drawn points stay on the element (data-points, data-last) for tests and for copying.

const NS = "http://www.w3.org/2000/svg";
const H = 220, LEFT = 56, RIGHT = 12, TOP = 12, BOTTOM = 28;

function el(name, attrs, text) {
  const e = document.createElementNS(NS, name);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  if (text !== undefined) e.textContent = text;
  return e;
}

// Round numbers for the axis: 1, 2 or 5 times a power of ten, about `count` steps up to `max`.
export function ticks(max, count = 4) {
  if (max <= 0) return [0];
  const raw = max / count;
  const power = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * power).find((s) => s >= raw);
  const out = [];
  for (let v = 0; v <= max + step / 2; v += step) out.push(v);
  return out;
}

function clock(ms) {
  return new Date(ms).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" });
}

export function lineChart(points, { label = "", width = 800 } = {}) {
  const W = Math.max(320, Math.round(width));
  const svg = el("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, class: "chart", role: "img",
                          "aria-label": label, "data-points": JSON.stringify(points),
                          "data-last": points.length ? points[points.length - 1][1] : "" });
  if (points.length === 0) {
    svg.append(el("text", { x: W / 2, y: H / 2, "text-anchor": "middle" }, "no samples yet"));
    return svg;
  }
  const t0 = points[0][0], t1 = Math.max(points[points.length - 1][0], t0 + 1000);
  const axis = ticks(Math.max(...points.map((p) => p[1])));
  const top = axis[axis.length - 1] || 1;
  const x = (t) => LEFT + ((t - t0) / (t1 - t0)) * (W - LEFT - RIGHT);
  const y = (v) => H - BOTTOM - (v / top) * (H - TOP - BOTTOM);
  for (const v of axis) {
    svg.append(el("line", { x1: LEFT, x2: W - RIGHT, y1: y(v), y2: y(v), class: "axis" }));
    svg.append(el("text", { x: LEFT - 6, y: y(v) + 4, "text-anchor": "end" }, v.toLocaleString()));
  }
  svg.append(el("text", { x: LEFT, y: H - 8 }, clock(t0)));
  svg.append(el("text", { x: W - RIGHT, y: H - 8, "text-anchor": "end" }, clock(t1)));
  const path = points.map(([t, v]) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`).join(" ");
  svg.append(el("polygon", { class: "area",
                             points: `${x(t0)},${y(0)} ${path} ${x(points[points.length - 1][0])},${y(0)}` }));
  svg.append(el("polyline", { class: "line", points: path }));
  return svg;
}
