"use strict";(self.rspackChunktrainhub_panel=self.rspackChunktrainhub_panel||[]).push([[700],{646(t,e,r){var o=r(601),n=r.n(o),a=r(314),i=(r.n(a))()(n());i.push([t.id,`.th-Panel { display: flex; flex-direction: column; background: var(--jp-layout-color1); color: var(--jp-ui-font-color1); font-size: var(--jp-ui-font-size1); min-width: 260px; }
.th-tabs { display: flex; border-bottom: 1px solid var(--jp-border-color2); }
.th-tab { flex: 1; border: none; background: none; padding: 6px 4px; cursor: pointer; color: var(--jp-ui-font-color2); }
.th-tab.th-active { color: var(--jp-ui-font-color0); border-bottom: 2px solid var(--jp-brand-color1); }
.th-status { padding: 2px 8px; color: var(--jp-ui-font-color2); font-size: var(--jp-ui-font-size0); min-height: 1.4em; word-break: break-all; }
.th-status.th-error { color: var(--jp-error-color1); }
.th-body { flex: 1; overflow: auto; padding: 0 4px; }
.th-toolbar { display: flex; flex-wrap: wrap; gap: 4px; padding: 4px; align-items: center; }
.th-btn.th-active { font-weight: bold; }
.th-upload-input { display: none; }
.th-search { flex: 1; min-width: 100px; }
.th-crumbs { padding: 2px 6px; }
.th-crumb { color: var(--jp-content-link-color); text-decoration: none; }
.th-list { list-style: none; margin: 0; padding: 0; }
.th-entry { display: flex; align-items: center; gap: 6px; padding: 2px 6px; }
.th-entry:hover, .th-item-head:hover { background: var(--jp-layout-color2); }
.th-name { flex: 1; cursor: pointer; overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
.th-size { color: var(--jp-ui-font-color2); font-size: var(--jp-ui-font-size0); }
.th-actions .th-btn { padding: 0 3px; min-width: 0; }
.th-preview img { max-width: 100%; }
.th-preview-title { font-weight: bold; padding: 4px 6px; }
.th-preview-text { max-height: 240px; overflow: auto; margin: 0 6px; font-size: var(--jp-code-font-size); background: var(--jp-layout-color2); }
.th-item { padding: 4px 6px; border-bottom: 1px solid var(--jp-border-color3); }
.th-item-head { cursor: pointer; }
.th-desc, .th-metrics, .th-lineage { color: var(--jp-ui-font-color2); font-size: var(--jp-ui-font-size0); }
.th-version { padding: 3px 0 3px 10px; border-left: 2px solid var(--jp-border-color2); margin: 3px 0; }
.th-badge { margin-left: 6px; padding: 0 4px; border-radius: 3px; font-size: var(--jp-ui-font-size0); }
.th-deprecated { background: var(--jp-warn-color3); }
.th-state-failed .th-state, .th-state-lost .th-state { color: var(--jp-error-color1); }
.th-state-succeeded .th-state { color: var(--jp-success-color1); }

.th-usage {
  border-collapse: collapse;
  font-size: var(--jp-ui-font-size1);
  margin-top: 4px;
}

.th-usage th,
.th-usage td {
  padding: 1px 6px;
  text-align: right;
}

.th-usage th:first-child,
.th-usage td:first-child {
  text-align: left;
}

.th-usage-total {
  margin: 4px 0;
}
`,""]),r.d(e,{},{A:i})},314(t){t.exports=function(t){var e=[];return e.toString=function(){return this.map(function(e){var r="",o=void 0!==e[5];return e[4]&&(r+="@supports (".concat(e[4],") {")),e[2]&&(r+="@media ".concat(e[2]," {")),o&&(r+="@layer".concat(e[5].length>0?" ".concat(e[5]):""," {")),r+=t(e),o&&(r+="}"),e[2]&&(r+="}"),e[4]&&(r+="}"),r}).join("")},e.i=function(t,r,o,n,a){"string"==typeof t&&(t=[[null,t,void 0]]);var i={};if(o)for(var s=0;s<this.length;s++){var p=this[s][0];null!=p&&(i[p]=!0)}for(var c=0;c<t.length;c++){var l=[].concat(t[c]);o&&i[l[0]]||(void 0!==a&&(void 0===l[5]||(l[1]="@layer".concat(l[5].length>0?" ".concat(l[5]):""," {").concat(l[1],"}")),l[5]=a),r&&(l[2]&&(l[1]="@media ".concat(l[2]," {").concat(l[1],"}")),l[2]=r),n&&(l[4]?(l[1]="@supports (".concat(l[4],") {").concat(l[1],"}"),l[4]=n):l[4]="".concat(n)),e.push(l))}},e}},601(t){t.exports=function(t){return t[1]}},72(t){var e=[];function r(t){for(var r=-1,o=0;o<e.length;o++)if(e[o].identifier===t){r=o;break}return r}function o(t,o){for(var n={},a=[],i=0;i<t.length;i++){var s=t[i],p=o.base?s[0]+o.base:s[0],c=n[p]||0,l="".concat(p," ").concat(c);n[p]=c+1;var d=r(l),u={css:s[1],media:s[2],sourceMap:s[3],supports:s[4],layer:s[5]};if(-1!==d)e[d].references++,e[d].updater(u);else{var h=function(t,e){var r=e.domAPI(e);return r.update(t),function(e){e?(e.css!==t.css||e.media!==t.media||e.sourceMap!==t.sourceMap||e.supports!==t.supports||e.layer!==t.layer)&&r.update(t=e):r.remove()}}(u,o);o.byIndex=i,e.splice(i,0,{identifier:l,updater:h,references:1})}a.push(l)}return a}t.exports=function(t,n){var a=o(t=t||[],n=n||{});return function(t){t=t||[];for(var i=0;i<a.length;i++){var s=r(a[i]);e[s].references--}for(var p=o(t,n),c=0;c<a.length;c++){var l=r(a[c]);0===e[l].references&&(e[l].updater(),e.splice(l,1))}a=p}}},659(t){var e={};t.exports=function(t,r){var o=function(t){if(void 0===e[t]){var r=document.querySelector(t);if(window.HTMLIFrameElement&&r instanceof window.HTMLIFrameElement)try{r=r.contentDocument.head}catch(t){r=null}e[t]=r}return e[t]}(t);if(!o)throw Error("Couldn't find a style target. This probably means that the value for the 'insert' parameter is invalid.");o.appendChild(r)}},540(t){t.exports=function(t){var e=document.createElement("style");return t.setAttributes(e,t.attributes),t.insert(e,t.options),e}},56(t,e,r){t.exports=function(t){var e=r.nc;e&&t.setAttribute("nonce",e)}},825(t){t.exports=function(t){if("u"<typeof document)return{update:function(){},remove:function(){}};var e=t.insertStyleElement(t);return{update:function(r){var o,n,a;o="",r.supports&&(o+="@supports (".concat(r.supports,") {")),r.media&&(o+="@media ".concat(r.media," {")),(n=void 0!==r.layer)&&(o+="@layer".concat(r.layer.length>0?" ".concat(r.layer):""," {")),o+=r.css,n&&(o+="}"),r.media&&(o+="}"),r.supports&&(o+="}"),(a=r.sourceMap)&&"u">typeof btoa&&(o+="\n/*# sourceMappingURL=data:application/json;base64,".concat(btoa(unescape(encodeURIComponent(JSON.stringify(a))))," */")),t.styleTagTransform(o,e,t.options)},remove:function(){var t;null===(t=e).parentNode||t.parentNode.removeChild(t)}}}},113(t){t.exports=function(t,e){if(e.styleSheet)e.styleSheet.cssText=t;else{for(;e.firstChild;)e.removeChild(e.firstChild);e.appendChild(document.createTextNode(t))}}},959(t,e,r){var o=r(72),n=r.n(o),a=r(825),i=r.n(a),s=r(659),p=r.n(s),c=r(56),l=r.n(c),d=r(540),u=r.n(d),h=r(113),f=r.n(h),v=r(646),x={};x.styleTagTransform=f(),x.setAttributes=l(),x.insert=p().bind(null,"head"),x.domAPI=i(),x.insertStyleElement=u(),n()(v.A,x),v.A&&v.A.locals&&v.A.locals}}]);