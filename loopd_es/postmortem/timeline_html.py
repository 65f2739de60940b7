"""``history GOAL --html FILE``: the timeline as one self-contained page (inline CSS, JS and SVG; no network).

Python computes the lanes from the same fold ``history`` prints (status, identity and run intervals come from
the field changes, not from re-reading payloads), and embeds them with every envelope as JSON; the page's
script draws them on a time axis (or in event order, for bursts), marks errors and switches, and shows an
event's envelope, payload and state changes on hover and click. When it has drawn, the script records what it
drew (lanes, marks, final status) in ``#facts``: tests read that back through the browser. Times are effective
times (an imported event's source time); events an import synthesised from loopd's ``state.json`` are drawn
hollow and dashed, and labelled ``state.json`` in the list.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any, Final

import msgspec

from ..clock import EPOCH, ms_between, parse_rfc3339
from .branches import branches
from .history import History, called_by, short_stream, show, show_change

if TYPE_CHECKING:
    from .explain import Explanation

ERRORS: Final = frozenset(
    {
        "run.failed",
        "run.stuck",
        "identity.provider_limit_observed",
        "identity.switch_failed",
        "identity.rollback_failed",
        "identity.fallback_exhausted",
        "identity.fallback_unavailable",
        "goal.blocked",
        "goal.budget_exhausted",
        "goal.completion_rejected",
        "saga.host_call_failed",
    }
)
SWITCHES: Final = frozenset(
    {
        "identity.switch_requested",
        "identity.switch_deferred",
        "identity.switch_applied",
        "identity.switch_rolled_back",
        "identity.fallback_prepared",
        "identity.switch_unsupported",
    }
)
_LANE_OF_ERROR: Final = {
    "run.failed": "runs",
    "run.stuck": "runs",
    "identity.provider_limit_observed": "runs",
    "goal.blocked": "status",
    "goal.budget_exhausted": "status",
    "goal.completion_rejected": "status",
}


def timeline_model(history: History, explanation: Explanation | None = None) -> dict[str, Any]:
    """Everything the page draws: events (with envelope, payload and changes), lanes, intervals and marks."""
    goal = history.goal_id
    events: list[dict[str, Any]] = []
    segments: list[dict[str, Any]] = []
    open_: dict[str, dict[str, Any]] = {}
    has_other = any(not e.own for e in history.entries)
    model = agent = None

    def close(lane: str, index: int) -> None:
        seg = open_.pop(lane, None)
        if seg is not None:
            seg["to"] = index

    def start(lane: str, index: int, label: str, cls: str) -> None:
        close(lane, index)
        seg = {"lane": lane, "from": index, "to": None, "label": label, "cls": cls}
        open_[lane] = seg
        segments.append(seg)

    for k, e in enumerate(history.entries):
        env = e.envelope
        changes = {c.field: c for c in e.changes}
        begins = env.type in ("goal.created", "goal.forked_from")
        if "status" in changes or (begins and "exists" in changes):
            status = changes["status"].after if "status" in changes else "active"  # created: the default
            start("status", k, str(status), f"s-{status}")
        if "cleared" in changes:
            start("status", k, "cleared", "s-cleared")
        if "config.model" in changes or "config.agent" in changes or begins:
            model = changes["config.model"].after if "config.model" in changes else model
            agent = changes["config.agent"].after if "config.agent" in changes else agent
            start("identity", k, f"{model or 'default model'} · {agent or 'default agent'}", "identity")
        if "phase" in changes:
            phase = changes["phase"].after
            if phase == "running":
                start("runs", k, f"run {e.data().get('turn_count', '')}".strip(), "run")
            elif "runs" in open_:
                open_["runs"]["cls"] = "run-failed" if env.type == "run.failed" else "run"
                close("runs", k)
        kind = "error" if env.type in ERRORS else "switch" if env.type in SWITCHES else "event"
        data = e.data()
        if not e.own:
            lane = "other"
        elif kind == "error":
            lane = _LANE_OF_ERROR.get(env.type, "identity")
        elif kind == "switch":
            lane = "identity"
        elif env.type.startswith("run."):
            lane = "runs"
        else:
            lane = "events"
        events.append(
            {
                "i": k,
                "position": env.position,
                "stream": env.stream,
                "short": short_stream(env.stream, goal),
                "version": env.version,
                "type": env.type,
                "event_id": env.event_id,
                "recorded_at": env.recorded_at,
                "occurred_at": e.at,
                "t": _millis(e.at, env.recorded_at),
                "origin": e.origin(),
                "synthesised": e.synthesised,
                "causation_id": env.causation_id,
                "correlation_id": env.correlation_id,
                "schema_version": env.schema_version,
                "data": data,
                "changes": [show_change(c, 140) for c in e.changes] if e.own else [],
                "summary": e.summary(),
                "by": called_by(env.type, data),
                "refused": e.refused,
                "kind": kind,
                "lane": lane,
                "own": e.own,
            }
        )
    lanes = [
        {"id": "status", "label": "Status"},
        {"id": "identity", "label": "Identity"},
        {"id": "runs", "label": "Runs"},
        {"id": "events", "label": "Goal events"},
    ]
    if has_other:
        lanes.append({"id": "other", "label": "Sagas · commands"})
    st = history.state
    status_event = explanation.steps[0].fact.position if explanation and explanation.steps else None
    on_page = {e.envelope.event_id for e in history.entries}
    outside = {  # an imported event caused by nothing the source shows: caused by the import itself
        e.envelope.causation_id: f"import.started on {e.envelope.correlation_id} (the source shows no earlier cause)"
        for e in history.entries
        if e.imported is not None
        and e.envelope.causation_id is not None
        and e.envelope.causation_id not in on_page
        and e.envelope.correlation_id is not None
    }
    return {
        "goal_id": goal,
        "name": st.name,
        "status": st.status if st.exists else "cleared",
        "phase": st.phase,
        "model": st.config.model,
        "agent": st.config.agent,
        "streams": list(history.streams),
        "until": history.until,
        "at": history.at,
        "lanes": lanes,
        "segments": segments,
        "events": events,
        "blocker": show(st.blocker.reason, 200) if st.blocker else None,
        "why": explanation.sentence if explanation else None,
        "outside": outside,
        "status_event": status_event,
        "branches": branches(history),
    }


def _millis(at: str, recorded_at: str) -> float:
    """Epoch milliseconds of the event's effective time (its recorded time if the source's does not parse)."""
    try:
        return ms_between(parse_rfc3339(at), EPOCH)
    except ValueError:
        return ms_between(parse_rfc3339(recorded_at), EPOCH)


def render_html(history: History, explanation: Explanation | None = None) -> str:
    """The page, as one string: the template with the model embedded as JSON (``<`` escaped)."""
    model = timeline_model(history, explanation)
    data = msgspec.json.encode(model).replace(b"<", b"\\u003c").decode()
    title = html.escape(f"{model['name'] or history.goal_id} — loopd-es timeline")
    head, rest = _TEMPLATE.split("{{TITLE}}")  # one pass: a name holding "{{DATA}}" stays text
    middle, tail = rest.split("{{DATA}}")
    return head + title + middle + data + tail


_TEMPLATE: Final = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{TITLE}}</title>
<style>
:root{--bg:#f6f7fb;--card:#fff;--ink:#1f2330;--muted:#6b7385;--line:#e3e6ee;--accent:#5b5bd6;
--active:#2f9e5b;--paused:#8c95a6;--blocked:#d64545;--budget_limited:#d08a12;--usage_limited:#c8611b;
--complete:#2f6fd6;--switch:#7b4fd6;--error:#d64545;--other:#178a8a}
*{box-sizing:border-box}body{margin:0;background:var(--bg);color:var(--ink);
font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif}
header{background:linear-gradient(120deg,#262a45,#3b3f78);color:#fff;padding:22px 32px 18px}
header h1{margin:0 0 6px;font-size:22px;font-weight:650;display:flex;align-items:center;gap:12px}
.badge{font-size:12px;font-weight:700;letter-spacing:.04em;text-transform:uppercase;padding:3px 10px;
border-radius:999px;background:var(--paused);color:#fff}
.meta{display:flex;flex-wrap:wrap;gap:6px 26px;color:#c9cdf2;font-size:13px}.meta b{color:#fff;font-weight:600}
main{padding:18px 32px 40px;display:grid;gap:16px}
.card{background:var(--card);border:1px solid var(--line);border-radius:12px;box-shadow:0 1px 3px #0000000d}
.why{padding:14px 18px;border-left:5px solid var(--accent)}.why h2{margin:0 0 4px;font-size:13px;
color:var(--muted);text-transform:uppercase;letter-spacing:.05em}.why p{margin:0}
.chart{padding:12px 14px 6px}.toolbar{display:flex;align-items:center;gap:14px;margin:0 4px 6px;flex-wrap:wrap}
.toolbar h2{font-size:15px;margin:0 auto 0 0}.seg{display:inline-flex;border:1px solid var(--line);border-radius:8px;
overflow:hidden}.seg button{border:0;background:#fff;padding:5px 12px;font:inherit;cursor:pointer;color:var(--muted)}
.seg button.on{background:var(--accent);color:#fff}.legend{display:flex;gap:12px;color:var(--muted);font-size:12px}
.legend i{display:inline-block;width:10px;height:10px;margin-right:5px;vertical-align:-1px;border-radius:2px}
svg{display:block;width:100%}.lane-label{font-size:12px;font-weight:600;fill:var(--muted)}
.lane-bg{fill:#f3f4f9}.segtext{font-size:11px;fill:#fff;font-weight:600;pointer-events:none}
.tick{stroke:var(--line)}.ticktext{font-size:11px;fill:var(--muted)}
.mark{cursor:pointer;transition:opacity .1s}.mark:hover{opacity:.75}.mark.sel{stroke:#111;stroke-width:2.5}
.causeline{stroke:var(--accent);stroke-width:1.5;stroke-dasharray:4 3;fill:none}
.grid{display:grid;grid-template-columns:minmax(340px,1fr) minmax(420px,1.3fr);gap:16px;align-items:start}
.details{padding:14px 18px}.details h3{margin:0 0 8px;font-size:16px}.kv{display:grid;grid-template-columns:
110px 1fr;gap:3px 10px;font-size:12.5px;margin-bottom:10px}.kv span:nth-child(odd){color:var(--muted)}
code,pre{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12px}
pre{background:#f4f5fa;border:1px solid var(--line);border-radius:8px;padding:10px;overflow:auto;max-height:260px;margin:0}
.changes{margin:0 0 10px;padding:0;list-style:none}.changes li{padding:3px 8px;border-left:3px solid var(--switch);
background:#f7f5fd;margin-bottom:3px;border-radius:3px;font-family:ui-monospace,Menlo,monospace;font-size:12px;
word-break:break-word}.refused{color:var(--error);font-weight:600}a.jump{color:var(--accent);cursor:pointer}
.list{max-height:520px;overflow:auto}table{border-collapse:collapse;width:100%;font-size:12.5px}
th{position:sticky;top:0;background:#fafbfe;text-align:left;color:var(--muted);font-weight:600;padding:8px 10px;
border-bottom:1px solid var(--line)}td{padding:6px 10px;border-bottom:1px solid #f0f1f6;vertical-align:top}
tr.row{cursor:pointer}tr.row:hover{background:#f7f8fc}tr.row.sel{background:#ecebfb}
.pill{display:inline-block;border-radius:4px;padding:0 6px;font-size:11px;font-weight:600;color:#fff}
.k-error{background:var(--error)}.k-switch{background:var(--switch)}.k-event{background:#9aa1b2}
.k-other{background:var(--other)}.muted{color:var(--muted)}
.k-synth{background:#fff;color:var(--muted);border:1px dashed var(--muted)}
.mark.synth{fill-opacity:.18;stroke-width:2;stroke-dasharray:2.5 1.5}
.tip{position:fixed;pointer-events:none;background:#1f2330;color:#fff;padding:7px 10px;border-radius:7px;
font-size:12px;max-width:380px;box-shadow:0 4px 14px #0003;opacity:0;transition:opacity .08s;z-index:9}
@media (max-width:1000px){.grid{grid-template-columns:1fr}}
</style></head>
<body>
<header><h1><span id="name"></span><span class="badge" id="badge"></span></h1>
<div class="meta" id="meta"></div></header>
<main>
<section class="card why" id="why" hidden><h2 id="why-title">Why</h2><p id="why-text"></p></section>
<section class="card chart"><div class="toolbar"><h2>Timeline</h2>
<div class="legend"><span><i style="background:var(--error)"></i>error</span>
<span><i style="background:var(--switch)"></i>switch</span><span><i style="background:#9aa1b2"></i>event</span>
<span><i style="background:var(--other)"></i>saga / command</span>
<span><i style="border:1.5px dashed var(--muted)"></i>synthesised from state.json</span></div>
<div class="seg" id="scale"><button data-s="time" class="on">Time</button><button data-s="order">Event order</button></div>
</div><svg id="chart" role="img" aria-label="goal timeline"></svg></section>
<section class="grid"><div class="card details" id="details"><h3>Select an event</h3>
<p class="muted">Hover a mark for a summary; click it (or a row) for its envelope, payload and state change.</p></div>
<div class="card list"><table><thead><tr><th>#</th><th>time</th><th>stream</th><th>event</th><th>what it did</th>
</tr></thead><tbody id="rows"></tbody></table></div></section>
</main>
<div class="tip" id="tip"></div>
<div id="facts" hidden></div>
<script type="application/json" id="data">{{DATA}}</script>
<script>
(function(){
"use strict";
const M=JSON.parse(document.getElementById("data").textContent);
const E=M.events, NS="http://www.w3.org/2000/svg", $=id=>document.getElementById(id);
const byId=new Map(E.map(e=>[e.event_id,e]));
const T0=E.length?E.reduce((a,e)=>Math.min(a,e.t),Infinity):0, T1=E.length?E.reduce((a,e)=>Math.max(a,e.t),-Infinity):0;
const COLORS={active:"var(--active)",paused:"var(--paused)",blocked:"var(--blocked)",complete:"var(--complete)",
 budget_limited:"var(--budget_limited)",usage_limited:"var(--usage_limited)",cleared:"var(--paused)"};
let scale="time", selected=null;
const esc=s=>String(s==null?"":s).replace(/[&<>"]/g,c=>({"&":"&amp;","<":"&lt;",">":"&gt;",'"':"&quot;"}[c]));
const clock=t=>{const d=new Date(t);return d.toISOString().slice(11,23)};
function header(){
 $("name").textContent=M.name||M.goal_id; const b=$("badge"); b.textContent=M.status.replace("_"," ");
 b.style.background=COLORS[M.status]||"var(--paused)";
 const span=E.length?clock(T0)+" → "+clock(T1)+" UTC":"no events";
 const cut=M.until!=null?" · cut at #"+M.until:(M.at?" · cut at "+M.at:"");
 $("meta").innerHTML=[["goal",M.goal_id],["phase",M.phase],["model",M.model||"default"],["agent",M.agent||"default"],
  ["events",E.length+cut],["streams",M.streams.length],["span",span]]
  .map(([k,v])=>"<span>"+esc(k)+" <b>"+esc(v)+"</b></span>").join("");
 for(const b of M.branches||[]){const s=document.createElement("span");
  s.innerHTML=esc(b.kind==="fork"?"fork made at #"+b.position:"forked from at #"+b.position)+" <b>"+esc(b.goal_id)+"</b>"
   +(b.changed.length?" ("+esc(b.changed.join(", "))+")":"");$("meta").appendChild(s)}
 if(M.why){$("why").hidden=false;$("why-title").textContent="Why "+M.status.replace("_"," ");$("why-text").textContent=M.why}
 else if(M.blocker){$("why").hidden=false;$("why-text").textContent=M.blocker}
}
function xOf(W){
 const L=130,R=24,w=W-L-R;
 if(!E.length) return ()=>L;
 const t0=T0,t1=T1;
 if(scale==="order"||t1<=t0) return i=>L+(E.length<2?w/2:w*i/(E.length-1));
 return i=>L+w*(E[i].t-t0)/(t1-t0);
}
function el(tag,attrs,parent){const n=document.createElementNS(NS,tag);for(const k in attrs)n.setAttribute(k,attrs[k]);
 if(parent)parent.appendChild(n);return n}
function draw(){
 const svg=$("chart"); svg.innerHTML="";
 const W=svg.clientWidth||1200, LH=44, top=8, lanes=M.lanes, H=top+lanes.length*LH+34;
 svg.setAttribute("viewBox","0 0 "+W+" "+H); svg.setAttribute("height",H);
 const x=xOf(W), laneY={}; let n=0;
 lanes.forEach((l,k)=>{const y=top+k*LH; laneY[l.id]=y+LH/2;
  el("rect",{x:120,y:y+4,width:W-130,height:LH-8,rx:7,class:"lane-bg"},svg);
  el("text",{x:8,y:y+LH/2+4,class:"lane-label"},svg).textContent=l.label;});
 const axisY=top+lanes.length*LH+4, ticks=6;
 for(let k=0;k<=ticks&&E.length;k++){const i=Math.round((E.length-1)*k/ticks);
  let xx, label;
  if(scale==="time"&&T1>T0){const t=T0+(T1-T0)*k/ticks;
   xx=130+(W-154)*k/ticks; label=clock(t)} else {xx=x(i); label="#"+E[i].position}
  el("line",{x1:xx,x2:xx,y1:top,y2:axisY,class:"tick"},svg);
  el("text",{x:xx,y:axisY+16,"text-anchor":k===0?"start":k===ticks?"end":"middle",class:"ticktext"},svg)
   .textContent=label;}
 for(const s of M.segments){const y=laneY[s.lane]; if(y==null)continue;
  const x0=x(s.from), x1=s.to==null?W-24:x(s.to), w=Math.max(3,x1-x0);
  const color=s.cls.startsWith("s-")?COLORS[s.cls.slice(2)]:s.cls==="identity"?"#dcd8fa":
   s.cls==="run-failed"?"#e07a7a":"#4f8fd6";
  const r=el("rect",{x:x0,y:y-12,width:w,height:24,rx:5,fill:color,opacity:s.lane==="runs"?.8:.92},svg);
  el("title",{},r).textContent=s.label;
  if(w>60){const t=el("text",{x:x0+8,y:y+4,class:"segtext",style:s.cls==="identity"?"fill:#3d3585":""},svg);
   t.textContent=s.label.length*6.5>w-12?s.label.slice(0,Math.max(3,Math.floor((w-16)/6.5)))+"…":s.label}}
 const g=el("g",{},svg);
 for(const e of E){const y=laneY[e.lane], xx=x(e.i); let m;
  const fill=e.kind==="error"?"var(--error)":e.kind==="switch"?"var(--switch)":e.own?"#9aa1b2":"var(--other)";
  if(e.kind==="error"){m=el("path",{d:`M${xx} ${y-7}L${xx+7} ${y}L${xx} ${y+7}L${xx-7} ${y}Z`,fill,stroke:"#fff"},g)}
  else if(e.kind==="switch"){m=el("path",{d:`M${xx} ${y-7}L${xx+7} ${y+6}L${xx-7} ${y+6}Z`,fill,stroke:"#fff"},g)}
  else if(!e.own){m=el("rect",{x:xx-4.5,y:y-4.5,width:9,height:9,rx:2,fill,stroke:"#fff"},g)}
  else {m=el("circle",{cx:xx,cy:y,r:4.5,fill,stroke:"#fff"},g)}
  if(e.synthesised) m.setAttribute("stroke",fill);
  m.setAttribute("class","mark"+(e.synthesised?" synth":"")+(selected===e?" sel":"")); m.dataset.i=e.i; n++;
  m.addEventListener("mousemove",ev=>tip(ev,e)); m.addEventListener("mouseleave",()=>{$("tip").style.opacity=0});
  m.addEventListener("click",()=>select(e,true));}
 if(selected){const c=byId.get(selected.causation_id);
  if(c){const ya=laneY[selected.lane], yb=laneY[c.lane], xa=x(selected.i), xb=x(c.i);
   el("path",{d:`M${xb} ${yb}C${(xa+xb)/2} ${yb-30},${(xa+xb)/2} ${ya-30},${xa} ${ya}`,class:"causeline"},svg)}}
 return {lanes:lanes.length,marks:n,segments:M.segments.length};
}
function tip(ev,e){const t=$("tip");
 t.innerHTML="<b>#"+e.position+" "+esc(e.type)+"</b><br>"+esc(e.short)+" · "+esc(e.occurred_at)+
  (e.origin?"<br><i>"+esc(e.origin)+"</i>":"")+(e.by?"<br>"+esc(e.by):"")+
  (e.changes.length?"<br>"+e.changes.slice(0,4).map(esc).join("<br>"):(e.summary?"<br>"+esc(e.summary):""));
 t.style.left=Math.min(ev.clientX+14,innerWidth-400)+"px"; t.style.top=(ev.clientY+14)+"px"; t.style.opacity=1}
function link(id){if(!id)return "<span class=muted>none</span>"; const c=byId.get(id);
 if(!c&&M.outside[id])return esc(M.outside[id]);
 return c?"<a class=jump data-jump='"+c.i+"'>#"+c.position+" "+esc(c.type)+"</a>":"<code>"+esc(id)+"</code>"+
  (id===selected.correlation_id?" <span class=muted>(the request that started the flow)</span>":"")}
function select(e,scroll){selected=e; draw();
 const d=$("details"), kids=E.filter(c=>c.causation_id===e.event_id);
 d.innerHTML="<h3>#"+e.position+" "+esc(e.type)+"</h3><div class=kv>"+
  [["stream",esc(e.stream)+" v"+e.version],["happened",esc(e.occurred_at)],["recorded",esc(e.recorded_at)],
   ...(e.origin?[["source",esc(e.origin)]]:[]),...(e.by?[["who",esc(e.by)]]:[]),["event id","<code>"+esc(e.event_id)+"</code>"],
   ["caused by",link(e.causation_id)],["flow","<code>"+esc(e.correlation_id||"none")+"</code>"],
   ["led to",kids.length?kids.map(c=>"<a class=jump data-jump='"+c.i+"'>#"+c.position+"</a>").join(" "):"<span class=muted>nothing</span>"]]
  .map(([k,v])=>"<span>"+k+"</span><span>"+v+"</span>").join("")+"</div>"+
  (e.refused?"<p class=refused>refused by the reducer: "+esc(e.refused)+"</p>":"")+
  (e.own?"<h4>State change</h4>"+(e.changes.length?"<ul class=changes>"+e.changes.map(c=>"<li>"+esc(c)+"</li>").join("")+
   "</ul>":"<p class=muted>no change to the goal's state</p>"):"<h4>Summary</h4><p>"+esc(e.summary||"-")+"</p>")+
  "<h4>Payload</h4><pre>"+esc(JSON.stringify(e.data,null,2))+"</pre>";
 d.querySelectorAll("a.jump").forEach(a=>a.addEventListener("click",()=>select(E[+a.dataset.jump],true)));
 document.querySelectorAll("tr.row.sel").forEach(r=>r.classList.remove("sel"));
 const row=document.querySelector("tr.row[data-i='"+e.i+"']"); if(row){row.classList.add("sel");
  if(scroll)row.scrollIntoView({block:"nearest"})}}
function rows(){const tb=$("rows"), parts=[];
 for(const e of E){const what=e.refused?"refused: "+e.refused:(e.own?(e.changes.length?e.changes.slice(0,3).join("; ")+
   (e.changes.length>3?" (+"+(e.changes.length-3)+")":""):"no state change"):e.summary);
  const k=e.own?e.kind:"other";
  parts.push("<tr class=row data-i="+e.i+"><td>"+e.position+"</td><td class=muted>"+clock(e.t)+"</td><td>"+esc(e.short)+
   "</td><td><span class='pill k-"+k+"'>"+esc(e.type)+"</span>"+(e.synthesised?" <span class='pill k-synth'>state.json</span>":"")+
   "</td><td>"+esc(what)+"</td></tr>")}
 tb.innerHTML=parts.join("");
 tb.addEventListener("click",ev=>{const r=ev.target.closest("tr.row"); if(r)select(E[+r.dataset.i],false)})}
header(); rows();
document.querySelectorAll("#scale button").forEach(b=>b.addEventListener("click",()=>{scale=b.dataset.s;
 document.querySelectorAll("#scale button").forEach(o=>o.classList.toggle("on",o===b)); draw()}));
const start=E.find(e=>e.position===M.status_event)||E[E.length-1];
if(start) select(start,false);
const drawn=draw();
addEventListener("resize",draw);
const f=$("facts"); f.dataset.ready="1"; f.dataset.lanes=drawn.lanes; f.dataset.marks=drawn.marks;
f.dataset.segments=drawn.segments; f.dataset.status=M.status;
f.dataset.errors=document.querySelectorAll("#chart path.mark[fill='var(--error)']").length;
f.dataset.selected=selected?selected.type:"";
f.dataset.synthesised=document.querySelectorAll("#chart .mark.synth").length;
f.dataset.span=E.length?clock(T0)+"-"+clock(T1):"";
})();
</script></body></html>
"""
