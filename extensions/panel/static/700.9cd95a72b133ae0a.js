"use strict";(self.rspackChunktrainhub_panel=self.rspackChunktrainhub_panel||[]).push([[700],{552(t,e,o){var r=o(174),a=o.n(r),i=o(567),n=(o.n(i))()(a());n.push([t.id,`/* trainhub side panel and main-area views. Colours and sizes come from JupyterLab's theme variables. */

.th-Panel { display: flex; flex-direction: column; background: var(--jp-layout-color1); color: var(--jp-ui-font-color1); font-size: var(--jp-ui-font-size1); min-width: 0; }

/* Tabs: icon above a short label; they share the width and wrap to a second row rather than being cut off. */
.th-tabs { display: flex; flex-wrap: wrap; border-bottom: 1px solid var(--jp-border-color2); }
.th-tab {
  flex: 1 1 auto; display: flex; flex-direction: column; align-items: center; gap: 1px;
  border: none; border-bottom: 2px solid transparent; background: none; padding: 4px 3px 2px; cursor: pointer;
  color: var(--jp-ui-font-color2); font-family: var(--jp-ui-font-family); font-size: var(--jp-ui-font-size1);
}
.th-tab:hover { background: var(--jp-layout-color2); }
.th-tab.th-active { color: var(--jp-ui-font-color0); border-bottom-color: var(--jp-brand-color1); }
.th-tab-label { font-size: var(--jp-ui-font-size0); line-height: 1.2; white-space: nowrap; }
.th-tab-icon, .th-icon, .th-entry-icon { display: inline-flex; align-items: center; }
.th-tab-icon svg, .th-icon svg { width: 16px; height: 16px; }
.th-tab.th-active .th-tab-icon .jp-icon3[fill] { fill: var(--jp-brand-color1); }

.th-status { padding: 2px 8px; color: var(--jp-ui-font-color2); font-size: var(--jp-ui-font-size0); min-height: 1.4em; word-break: break-all; }
.th-status.th-error { color: var(--jp-error-color1); }
.th-body { flex: 1; overflow: auto; padding: 0 4px; }
.th-toolbar { display: flex; flex-wrap: wrap; gap: 4px; padding: 4px; align-items: center; }
.th-btn { display: inline-flex; align-items: center; gap: 4px; }
.th-btn.th-icon-btn { padding: 0 4px; min-width: 0; }
.th-btn:disabled { opacity: 0.45; cursor: not-allowed; }
.th-btn.th-active { font-weight: bold; }
.th-tip { display: inline-flex; }
.th-upload-input { display: none; }
.th-search { flex: 1; min-width: 100px; }
.th-crumbs { padding: 2px 6px; }
.th-crumb { color: var(--jp-content-link-color); text-decoration: none; }
.th-list { list-style: none; margin: 0; padding: 0; }
.th-entry { display: flex; align-items: center; gap: 6px; padding: 2px 6px; }
.th-entry:hover, .th-item-head:hover { background: var(--jp-layout-color2); }
.th-name { flex: 1; cursor: pointer; overflow: hidden; text-overflow: ellipsis; white-space: nowrap; display: flex; align-items: center; gap: 4px; }
.th-size { color: var(--jp-ui-font-color2); font-size: var(--jp-ui-font-size0); }
.th-actions { display: inline-flex; }
.th-preview img { max-width: 100%; }
.th-preview-title { font-weight: bold; padding: 4px 6px; }
.th-preview-text { max-height: 240px; overflow: auto; margin: 0 6px; font-size: var(--jp-code-font-size); background: var(--jp-layout-color2); }
.th-item { padding: 4px 6px; border-bottom: 1px solid var(--jp-border-color3); }
.th-item-head { cursor: pointer; }
.th-desc, .th-metrics, .th-lineage { color: var(--jp-ui-font-color2); font-size: var(--jp-ui-font-size0); }
.th-version { padding: 3px 0 3px 10px; border-left: 2px solid var(--jp-border-color2); margin: 3px 0; display: flex; flex-wrap: wrap; align-items: center; gap: 2px 6px; }
.th-model-version { display: block; }
.th-row { display: flex; flex-wrap: wrap; align-items: center; gap: 2px; }
.th-badge { margin-left: 6px; padding: 0 4px; border-radius: 3px; font-size: var(--jp-ui-font-size0); }
.th-deprecated { background: var(--jp-warn-color3); }
.th-state-failed .th-state, .th-state-lost .th-state { color: var(--jp-error-color1); }
.th-state-succeeded .th-state { color: var(--jp-success-color1); }
.th-state-running .th-state { color: var(--jp-brand-color1); }

/* usage (side panel and main area) */
.th-usage { border-collapse: collapse; font-size: var(--jp-ui-font-size1); margin-top: 4px; }
.th-usage th, .th-usage td { padding: 1px 6px; text-align: right; }
.th-usage td, .th-nowrap { white-space: nowrap; }
.th-usage th:first-child, .th-usage td:first-child { text-align: left; }
.th-usage-total { margin: 4px 0; }

/* main-area views */
.th-view { display: flex; flex-direction: column; background: var(--jp-layout-color1); color: var(--jp-ui-font-color1); font-size: var(--jp-ui-font-size1); padding: 4px 8px; overflow: hidden; }
.th-view-title { margin-right: 8px; }
.th-view-body { flex: 1; overflow: auto; }
.th-field { display: inline-flex; align-items: center; gap: 4px; }
.th-field[hidden] { display: none; }
.th-job-search { min-width: 160px; }
.th-table-wrap { flex: 1; overflow: auto; }
.th-table { border-collapse: collapse; width: 100%; }
.th-table th, .th-table td { padding: 3px 6px; text-align: left; border-bottom: 1px solid var(--jp-border-color2); white-space: nowrap; }
.th-table thead th { position: sticky; top: 0; background: var(--jp-layout-color2); z-index: 1; }
.th-table tbody tr:hover { background: var(--jp-layout-color2); }
.th-table .th-num { text-align: right; }
.th-table .th-reason { white-space: normal; min-width: 160px; color: var(--jp-ui-font-color2); font-size: var(--jp-ui-font-size0); }
.th-mono { font-family: var(--jp-code-font-family); }
.th-sort { border: none; background: none; padding: 0; font: inherit; font-weight: 600; color: inherit; cursor: pointer; }
.th-row-actions { display: flex; gap: 2px; align-items: center; }
.th-log { margin: 0; padding: 6px; font-family: var(--jp-code-font-family); font-size: var(--jp-code-font-size); white-space: pre-wrap; word-break: break-word; }
.th-figure { margin: 8px 0; max-width: 640px; }
.th-figure figcaption { margin-bottom: 2px; }
.th-metrics-view .th-view-body { display: flex; flex-wrap: wrap; gap: 0 24px; align-content: flex-start; }
.th-metrics-view .th-figure { flex: 1 1 420px; }
.th-tensorboard-frame { width: 100%; height: 100%; }

/* charts */
.th-chart { width: 100%; height: auto; display: block; }
.th-compact .th-chart { max-width: 100%; }
.th-chart text { fill: var(--jp-ui-font-color2); font-size: 11px; font-family: var(--jp-ui-font-family); }
.th-chart .th-grid { stroke: var(--jp-border-color2); stroke-width: 0.5; }
.th-chart .th-axis { stroke: var(--jp-border-color1); stroke-width: 1; }
.th-chart .th-line { fill: none; stroke-width: 1.5; }
.th-series-0 { --th-series: var(--jp-brand-color1); }
.th-series-1 { --th-series: var(--jp-warn-color1); }
.th-series-2 { --th-series: var(--jp-success-color1); }
.th-series-3 { --th-series: var(--jp-error-color1); }
.th-series-4 { --th-series: var(--jp-accent-color1); }
.th-series-5 { --th-series: var(--jp-ui-font-color2); }
.th-chart .th-line { stroke: var(--th-series); }
.th-chart .th-point, .th-chart .th-bar { fill: var(--th-series); }
.th-legend { display: flex; flex-wrap: wrap; gap: 2px 12px; font-size: var(--jp-ui-font-size0); color: var(--jp-ui-font-color2); }
.th-legend-item { display: inline-flex; align-items: center; gap: 4px; }
.th-swatch { display: inline-block; width: 10px; height: 10px; border-radius: 2px; background: var(--th-series); }

/* Status bar: this server's GPUs and the idle-GPU culler's countdown, with a link-like "keep". */
.th-gpustatus { display: flex; align-items: center; gap: 4px; white-space: nowrap; padding: 0 5px; }
.th-gpustatus.th-mod-warned .th-gpustatus-text { color: var(--jp-warn-color0); }
.th-gpustatus-keep {
  border: none; background: none; padding: 0 2px; cursor: pointer; font: inherit;
  color: var(--jp-brand-color1); text-decoration: underline;
}
.th-gpustatus-keep:hover { color: var(--jp-brand-color0); }
.th-gpustatus-keep:disabled { opacity: 0.5; cursor: wait; }
.th-gpustatus-keep[hidden] { display: none; }

/* %%train / %%sweep outputs (liveoutput.ts): the live widget, or a live view of the job from the jobs API */
.th-live-card { font-family: var(--jp-ui-font-family); font-size: var(--jp-ui-font-size1); color: var(--jp-ui-font-color1); line-height: 1.6; padding: 2px 0; }
.th-live-state { color: #fff; background: var(--jp-layout-color4); border-radius: 3px; padding: 0 6px; }
.th-live-state-queued { background: #8a6d00; }
.th-live-state-running { background: #1f6feb; }
.th-live-state-succeeded, .th-live-state-completed { background: #1a7f37; }
.th-live-state-failed, .th-live-state-lost { background: #cf222e; }
.th-live-state-cancelled { background: #6e7781; }
.th-live-reason, .th-live-note { color: var(--jp-ui-font-color2); font-size: var(--jp-ui-font-size0); }
.th-live-note.th-error { color: var(--jp-warn-color0); }
.th-live-metrics { font-size: var(--jp-ui-font-size0); }
.th-live-log { margin: 2px 0; max-height: 14em; overflow: auto; font-size: var(--jp-code-font-size); background: var(--jp-layout-color2); padding: 4px 6px; white-space: pre-wrap; }
.th-live-actions { display: flex; flex-wrap: wrap; gap: 4px; margin: 2px 0; }
.th-live-optuna { align-self: center; margin-left: 4px; font-size: var(--jp-ui-font-size1); color: var(--jp-content-link-color); }
.th-live-trials { border-collapse: collapse; font-size: var(--jp-ui-font-size0); margin: 2px 0; }
.th-live-trials th, .th-live-trials td { padding: 0 6px; text-align: left; }
.th-sweep-filter { display: inline-flex; align-items: center; gap: 4px; color: var(--jp-ui-font-color2); }

/* an empty registry tab: how to fill it */
.th-empty { padding: 6px 8px; color: var(--jp-ui-font-color2); }
.th-empty-hint p { margin: 4px 0; }
.th-ways { margin: 4px 0; }
.th-ways dt { font-weight: bold; color: var(--jp-ui-font-color1); margin-top: 4px; }
.th-ways dd { margin: 0 0 0 4px; }
.th-code { margin: 2px 0; padding: 3px 6px; background: var(--jp-layout-color2); font-size: var(--jp-code-font-size); white-space: pre-wrap; overflow-wrap: anywhere; user-select: text; }

/* trainhub's fields in the Create Notebook Job form (jobform.ts), laid out like the form's own fields. */
.th-jobform { display: flex; flex-direction: column; gap: 12px; font-family: var(--jp-ui-font-family); }
.th-jobform-title { color: var(--jp-ui-font-color2); font-size: var(--jp-ui-font-size1); }
.th-jobform-field { display: flex; flex-direction: column; gap: 3px; max-width: 28em; }
.th-jobform-label { color: var(--jp-ui-font-color1); font-size: var(--jp-ui-font-size1); }
.th-jobform-input { font-size: var(--jp-ui-font-size2); padding: 6px 8px; }
.th-jobform-input.th-jobform-invalid { border-color: var(--jp-error-color1); }
.th-jobform-hint { color: var(--jp-ui-font-color2); font-size: var(--jp-ui-font-size0); }
.th-jobform-error { color: var(--jp-error-color1); font-size: var(--jp-ui-font-size0); }
`,""]),o.d(e,{},{A:n})},567(t){t.exports=function(t){var e=[];return e.toString=function(){return this.map(function(e){var o="",r=void 0!==e[5];return e[4]&&(o+="@supports (".concat(e[4],") {")),e[2]&&(o+="@media ".concat(e[2]," {")),r&&(o+="@layer".concat(e[5].length>0?" ".concat(e[5]):""," {")),o+=t(e),r&&(o+="}"),e[2]&&(o+="}"),e[4]&&(o+="}"),o}).join("")},e.i=function(t,o,r,a,i){"string"==typeof t&&(t=[[null,t,void 0]]);var n={};if(r)for(var l=0;l<this.length;l++){var p=this[l][0];null!=p&&(n[p]=!0)}for(var s=0;s<t.length;s++){var c=[].concat(t[s]);r&&n[c[0]]||(void 0!==i&&(void 0===c[5]||(c[1]="@layer".concat(c[5].length>0?" ".concat(c[5]):""," {").concat(c[1],"}")),c[5]=i),o&&(c[2]&&(c[1]="@media ".concat(c[2]," {").concat(c[1],"}")),c[2]=o),a&&(c[4]?(c[1]="@supports (".concat(c[4],") {").concat(c[1],"}"),c[4]=a):c[4]="".concat(a)),e.push(c))}},e}},174(t){t.exports=function(t){return t[1]}},655(t){var e=[];function o(t){for(var o=-1,r=0;r<e.length;r++)if(e[r].identifier===t){o=r;break}return o}function r(t,r){for(var a={},i=[],n=0;n<t.length;n++){var l=t[n],p=r.base?l[0]+r.base:l[0],s=a[p]||0,c="".concat(p," ").concat(s);a[p]=s+1;var h=o(c),d={css:l[1],media:l[2],sourceMap:l[3],supports:l[4],layer:l[5]};if(-1!==h)e[h].references++,e[h].updater(d);else{var f=function(t,e){var o=e.domAPI(e);return o.update(t),function(e){e?(e.css!==t.css||e.media!==t.media||e.sourceMap!==t.sourceMap||e.supports!==t.supports||e.layer!==t.layer)&&o.update(t=e):o.remove()}}(d,r);r.byIndex=n,e.splice(n,0,{identifier:c,updater:f,references:1})}i.push(c)}return i}t.exports=function(t,a){var i=r(t=t||[],a=a||{});return function(t){t=t||[];for(var n=0;n<i.length;n++){var l=o(i[n]);e[l].references--}for(var p=r(t,a),s=0;s<i.length;s++){var c=o(i[s]);0===e[c].references&&(e[c].updater(),e.splice(c,1))}i=p}}},600(t){var e={};t.exports=function(t,o){var r=function(t){if(void 0===e[t]){var o=document.querySelector(t);if(window.HTMLIFrameElement&&o instanceof window.HTMLIFrameElement)try{o=o.contentDocument.head}catch(t){o=null}e[t]=o}return e[t]}(t);if(!r)throw Error("Couldn't find a style target. This probably means that the value for the 'insert' parameter is invalid.");r.appendChild(o)}},643(t){t.exports=function(t){var e=document.createElement("style");return t.setAttributes(e,t.attributes),t.insert(e,t.options),e}},439(t,e,o){t.exports=function(t){var e=o.nc;e&&t.setAttribute("nonce",e)}},868(t){t.exports=function(t){if("u"<typeof document)return{update:function(){},remove:function(){}};var e=t.insertStyleElement(t);return{update:function(o){var r,a,i;r="",o.supports&&(r+="@supports (".concat(o.supports,") {")),o.media&&(r+="@media ".concat(o.media," {")),(a=void 0!==o.layer)&&(r+="@layer".concat(o.layer.length>0?" ".concat(o.layer):""," {")),r+=o.css,a&&(r+="}"),o.media&&(r+="}"),o.supports&&(r+="}"),(i=o.sourceMap)&&"u">typeof btoa&&(r+="\n/*# sourceMappingURL=data:application/json;base64,".concat(btoa(unescape(encodeURIComponent(JSON.stringify(i))))," */")),t.styleTagTransform(r,e,t.options)},remove:function(){var t;null===(t=e).parentNode||t.parentNode.removeChild(t)}}}},456(t){t.exports=function(t,e){if(e.styleSheet)e.styleSheet.cssText=t;else{for(;e.firstChild;)e.removeChild(e.firstChild);e.appendChild(document.createTextNode(t))}}},959(t,e,o){var r=o(655),a=o.n(r),i=o(868),n=o.n(i),l=o(600),p=o.n(l),s=o(439),c=o.n(s),h=o(643),d=o.n(h),f=o(456),u=o.n(f),v=o(552),x={};x.styleTagTransform=u(),x.setAttributes=c(),x.insert=p().bind(null,"head"),x.domAPI=n(),x.insertStyleElement=d(),a()(v.A,x),v.A&&v.A.locals&&v.A.locals}}]);