// GCache: the searches this ComfyUI runs in the background (GCache Search, mode "background"), with their progress
// and a Cancel button, and the searches its models/gcache folders hold (finished, or paused: queue them again). A
// sidebar tab in ComfyUI's frontend (a floating panel where the frontend has no sidebar API).
// Data: GET /gcache/searches, live updates from the "gcache.search" event, Cancel: POST /gcache/searches/<id>/cancel.
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";

const searches = new Map();   // id -> the server's status of that search
const views = new Set();      // mounted panels

function text(tag, value, cls) {
  const el = document.createElement(tag);
  el.textContent = value;
  if (cls) el.className = cls;
  return el;
}

function render(root) {
  root.replaceChildren();
  root.append(text("h3", "GCache searches", "gcache-title"));
  const list = [...searches.values()].sort((a, b) => (b.updated || 0) - (a.updated || 0));
  if (!list.length) {
    root.append(text("p", "No GCache Search yet. Queue one with mode \"background\".", "gcache-empty"));
    return;
  }
  for (const s of list) {
    const row = document.createElement("div");
    row.className = "gcache-search";
    row.dataset.gcacheSearch = s.id;
    row.dataset.status = s.status;
    row.style.cssText = "border-bottom:1px solid #8884;padding:6px 2px;font-size:12px";
    const best = s.best_loss === null || s.best_loss === undefined ? "–" : Number(s.best_loss).toPrecision(4);
    row.append(text("div", s.id, "gcache-name"));
    row.append(text("div", `${s.status} · ${s.evaluations}/${s.budget} evaluations · best loss ${best}`,
                    "gcache-progress"));
    const bar = document.createElement("progress");
    bar.max = s.budget || 1;
    bar.value = Math.min(s.evaluations || 0, s.budget || 0);
    bar.style.width = "100%";
    row.append(bar);
    if (s.message) row.append(text("div", s.message, "gcache-message"));
    if (s.status === "queued" || s.status === "running") {
      // comfy-btn: the frontend's own button class and theme colours (frontends 1.27 and 1.49 both style it)
      const cancel = text("button", "Cancel", "comfy-btn gcache-cancel");
      cancel.style.cssText = "margin-top:4px;padding:2px 12px;font-size:12px";
      cancel.dataset.gcacheCancel = s.id;
      cancel.onclick = async () => {
        cancel.disabled = true;
        const r = await api.fetchApi(`/gcache/searches/${encodeURIComponent(s.id)}/cancel`, { method: "POST" });
        if (r.ok) update(await r.json());
      };
      row.append(cancel);
    }
    root.append(row);
  }
}

function update(status) {
  searches.set(status.id, { ...(searches.get(status.id) || {}), ...status });
  for (const v of views) render(v);
}

async function refresh() {
  const r = await api.fetchApi("/gcache/searches");
  if (!r.ok) return;
  const data = await r.json();
  searches.clear();
  for (const s of data.searches || []) searches.set(s.id, s);
  for (const v of views) render(v);
}

function mount(el) {
  const root = document.createElement("div");
  root.id = "gcache-searches";
  root.style.cssText = "padding:8px";
  el.append(root);
  views.add(root);
  render(root);
  refresh();
  return () => views.delete(root);
}

function openFloating() {  // frontends without a sidebar API, and a handle for scripts and tests
  let host = document.getElementById("gcache-searches-float");
  if (!host) {
    host = document.createElement("div");
    host.id = "gcache-searches-float";
    host.style.cssText = "position:fixed;right:12px;bottom:12px;width:320px;max-height:50vh;overflow:auto;" +
      "background:var(--comfy-menu-bg,#222);color:var(--fg-color,#ddd);z-index:10000;border:1px solid #8886";
    document.body.append(host);
    mount(host);
  }
  return host;
}

app.registerExtension({
  name: "gcache.searches",
  async setup() {
    api.addEventListener("gcache.search", (e) => {
      update(e.detail);
      if (e.detail.status === "done") app.refreshComboInNodes?.();  // its policy file, in GCache Apply's list at once
    });
    window.GCacheSearches = { open: openFloating, refresh, searches };
    const manager = app.extensionManager;
    if (manager?.registerSidebarTab) {
      manager.registerSidebarTab({
        id: "gcache-searches", icon: "pi pi-bolt", title: "GCache", tooltip: "GCache searches", type: "custom",
        render: (el) => mount(el),
      });
    }
  },
});
