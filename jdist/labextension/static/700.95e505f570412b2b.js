"use strict";(self.rspackChunkjdist=self.rspackChunkjdist||[]).push([[700],{547(r,o,t){var e=t(601),i=t.n(e),a=t(314),p=(t.n(a))()(i());p.push([r.id,`/* The dashboard charts (src/charts.ts), shared by the run view and the notebook's live dashboard
   (which also loads this file outside JupyterLab: each variable has a fallback). */

.jp-jdist-grid {
  display: flex;
  flex-wrap: wrap;
  gap: 12px;
  margin: 12px 0;
}

.jp-jdist-chartbox {
  border: var(--jp-border-width, 1px) solid var(--jp-border-color2, #e0e0e0);
  border-radius: 4px;
  padding: 4px;
  background: var(--jp-layout-color1, transparent);
}

.jp-jdist-chart {
  display: block;
  overflow: visible;
}

.jp-jdist-chart-title {
  fill: var(--jp-ui-font-color1, rgba(0, 0, 0, 0.87));
  font-size: 12px;
  font-weight: 600;
}

.jp-jdist-chart-legend,
.jp-jdist-tick,
.jp-jdist-axis-label {
  fill: var(--jp-ui-font-color2, rgba(0, 0, 0, 0.54));
  font-size: 10px;
}

.jp-jdist-barlabel {
  font-size: 10px;
}

.jp-jdist-nodata {
  fill: var(--jp-ui-font-color3, rgba(0, 0, 0, 0.38));
  font-size: 12px;
}

.jp-jdist-grid line,
line.jp-jdist-grid {
  stroke: var(--jp-border-color2, #e0e0e0);
  stroke-width: 1;
}

.jp-jdist-table-head {
  fill: var(--jp-ui-font-color1, rgba(0, 0, 0, 0.87));
  font-size: 11px;
  font-weight: 600;
}

.jp-jdist-table-cell {
  fill: var(--jp-ui-font-color1, rgba(0, 0, 0, 0.87));
  font-size: 11px;
}
`,""]),t.d(o,{},{A:p})},646(r,o,t){var e=t(601),i=t.n(e),a=t(314),p=t.n(a),n=t(547),s=p()(i());s.i(n.A),s.push([r.id,`/* jdist sidebar and run view. JupyterLab CSS variables only: follows light and dark themes. */

.jp-jdist-sidebar {
  background: var(--jp-layout-color1);
  color: var(--jp-ui-font-color1);
  font-family: var(--jp-ui-font-family);
  font-size: var(--jp-ui-font-size1);
  overflow-y: auto;
  padding: 0 8px 12px;
  min-width: 240px;
}

.jp-jdist-header {
  display: flex;
  align-items: center;
  justify-content: space-between;
  padding: 8px 0 4px;
  border-bottom: var(--jp-border-width) solid var(--jp-border-color2);
}

.jp-jdist-title {
  font-size: var(--jp-ui-font-size2);
  font-weight: 600;
  text-transform: uppercase;
  letter-spacing: 0.04em;
}

.jp-jdist-section-title {
  margin: 12px 0 6px;
  font-size: var(--jp-ui-font-size0);
  font-weight: 600;
  text-transform: uppercase;
  letter-spacing: 0.06em;
  color: var(--jp-ui-font-color2);
}

.jp-jdist-status.jp-jdist-error,
.jp-jdist-runview-head.jp-jdist-error {
  margin-top: 6px;
  padding: 6px;
  border-radius: 3px;
  color: var(--jp-error-color1);
  background: var(--jp-layout-color2);
}

.jp-jdist-empty {
  color: var(--jp-ui-font-color2);
  line-height: 1.5;
  padding: 4px 2px;
}

.jp-jdist-empty code,
.jp-jdist-code,
.jp-jdist-summary {
  font-family: var(--jp-code-font-family);
  font-size: var(--jp-code-font-size);
}

.jp-jdist-card {
  border: var(--jp-border-width) solid var(--jp-border-color2);
  border-radius: 4px;
  background: var(--jp-layout-color1);
  padding: 6px 8px;
  margin-bottom: 8px;
  box-shadow: var(--jp-elevation-z1);
}

.jp-jdist-card.jp-jdist-pending {
  opacity: 0.75;
}

.jp-jdist-card[data-status='dead'] {
  border-color: var(--jp-error-color1);
}

.jp-jdist-card-head {
  display: flex;
  align-items: center;
  gap: 6px;
  flex-wrap: wrap;
  margin-bottom: 2px;
}

.jp-jdist-nb {
  font-weight: 600;
  overflow: hidden;
  text-overflow: ellipsis;
  white-space: nowrap;
  flex: 1 1 auto;
  min-width: 0;
}

.jp-jdist-meta {
  color: var(--jp-ui-font-color2);
  font-size: var(--jp-ui-font-size0);
  line-height: 1.5;
}

.jp-jdist-problem {
  color: var(--jp-error-color1);
  font-size: var(--jp-ui-font-size0);
  margin: 2px 0;
  overflow: hidden;
  text-overflow: ellipsis;
}

.jp-jdist-badge {
  display: inline-block;
  padding: 0 6px;
  border-radius: 8px;
  font-size: var(--jp-ui-font-size0);
  line-height: 16px;
  white-space: nowrap;
  background: var(--jp-layout-color3);
  color: var(--jp-ui-font-color1);
}

/* coloured badges: mid-tone backgrounds with white text read the same in light and dark themes */
.jp-jdist-kernel-busy,
.jp-jdist-run-interrupted,
.jp-jdist-status-degraded {
  background: var(--jp-warn-color1);
  color: #fff;
}

.jp-jdist-run-running {
  background: var(--jp-brand-color1);
  color: #fff;
}

.jp-jdist-kernel-idle,
.jp-jdist-run-finished,
.jp-jdist-run-done {
  background: var(--jp-success-color1);
  color: #fff;
}

.jp-jdist-run-failed,
.jp-jdist-run-lost,
.jp-jdist-run-stopped,
.jp-jdist-status-dead {
  background: var(--jp-error-color1);
  color: #fff;
}

.jp-jdist-ranks {
  width: 100%;
  border-collapse: collapse;
  margin: 4px 0;
  font-size: var(--jp-ui-font-size0);
  table-layout: fixed;
}

.jp-jdist-ranks th {
  text-align: left;
  font-weight: 500;
  color: var(--jp-ui-font-color2);
  border-bottom: var(--jp-border-width) solid var(--jp-border-color2);
  padding: 1px 4px 1px 0;
}

.jp-jdist-ranks td {
  padding: 1px 4px 1px 0;
  overflow: hidden;
  text-overflow: ellipsis;
  white-space: nowrap;
}

.jp-jdist-ranks th:first-child,
.jp-jdist-ranks td:first-child {
  width: 2.8em;
}

.jp-jdist-options {
  margin: 2px 0 4px;
  font-size: var(--jp-ui-font-size0);
  color: var(--jp-ui-font-color2);
}

.jp-jdist-options summary {
  cursor: pointer;
}

.jp-jdist-option-table {
  width: 100%;
  border-collapse: collapse;
  margin-top: 2px;
}

.jp-jdist-option-table td {
  padding: 1px 4px 1px 0;
  color: var(--jp-ui-font-color1);
  white-space: nowrap;
}

.jp-jdist-scope {
  color: var(--jp-ui-font-color2);
  text-align: right;
}

.jp-jdist-scope-live {
  color: var(--jp-success-color1);
}

.jp-jdist-dot {
  display: inline-block;
  width: 8px;
  height: 8px;
  border-radius: 50%;
  margin-right: 4px;
  vertical-align: middle;
  background: var(--jp-layout-color4);
}

.jp-jdist-state-idle {
  background: var(--jp-success-color1);
}

.jp-jdist-state-busy {
  background: var(--jp-warn-color1);
  animation: jp-jdist-pulse 1.2s ease-in-out infinite;
}

.jp-jdist-state-dead {
  background: var(--jp-error-color1);
}

/* stopped at breakpoint(), waiting for a line typed in the notebook */
.jp-jdist-state-paused {
  background: var(--jp-brand-color1);
}

@keyframes jp-jdist-pulse {
  50% {
    opacity: 0.4;
  }
}

.jp-jdist-actions {
  display: flex;
  gap: 6px;
  margin-top: 4px;
}

.jp-jdist-button {
  flex: 1 1 0;
  padding: 3px 6px;
  border: var(--jp-border-width) solid var(--jp-border-color1);
  border-radius: 3px;
  background: var(--jp-layout-color2);
  color: var(--jp-ui-font-color1);
  font-size: var(--jp-ui-font-size1);
  cursor: pointer;
}

.jp-jdist-button:hover:enabled {
  background: var(--jp-layout-color3);
}

.jp-jdist-button:disabled {
  opacity: 0.45;
  cursor: default;
}

.jp-jdist-interrupt:enabled {
  border-color: var(--jp-warn-color1);
}

.jp-jdist-stop:enabled {
  border-color: var(--jp-error-color1);
}

.jp-jdist-iconbutton {
  border: none;
  background: transparent;
  color: var(--jp-ui-font-color1);
  font-size: 16px;
  cursor: pointer;
  padding: 0 4px;
}

.jp-jdist-message {
  font-size: var(--jp-ui-font-size0);
  margin-top: 4px;
  min-height: 0;
}

.jp-jdist-message:empty {
  display: none;
}

.jp-jdist-message-info {
  color: var(--jp-ui-font-color2);
}

.jp-jdist-message-ok {
  color: var(--jp-success-color1);
}

.jp-jdist-message-error {
  color: var(--jp-error-color1);
}

.jp-jdist-run-top {
  display: flex;
  align-items: center;
  gap: 6px;
}

.jp-jdist-run-top .jp-jdist-card-head {
  flex: 1 1 auto;
  min-width: 0;
  margin-bottom: 0;
}

.jp-jdist-run-top .jp-jdist-open {
  flex: none;
  padding: 1px 10px;
}

.jp-jdist-runid {
  font-weight: 600;
  white-space: nowrap;
}

.jp-jdist-sparks {
  display: flex;
  gap: 8px;
  margin-top: 2px;
}

.jp-jdist-spark-box {
  flex: 1 1 0;
  min-width: 0;
}

.jp-jdist-spark-label {
  font-size: var(--jp-ui-font-size0);
  color: var(--jp-ui-font-color2);
  white-space: nowrap;
  overflow: hidden;
  text-overflow: ellipsis;
}

.jp-jdist-spark-label b {
  color: var(--jp-ui-font-color1);
  font-weight: 600;
}

.jp-jdist-spark {
  display: block;
  width: 100%;
  height: 30px;
  background: var(--jp-layout-color2);
  border-radius: 2px;
}

.jp-jdist-spark-empty {
  stroke: var(--jp-border-color2);
  stroke-dasharray: 2 3;
}

/* sweeps in the sidebar: progress bar of trials ended out of the budget */
.jp-jdist-sweep-bar {
  height: 4px;
  margin: 3px 0 1px;
  background: var(--jp-layout-color3);
  border-radius: 2px;
  overflow: hidden;
}

.jp-jdist-sweep-bar > div {
  height: 100%;
  background: var(--jp-brand-color1);
}

.jp-jdist-sweep-best {
  font-size: var(--jp-ui-font-size0);
  white-space: nowrap;
  overflow: hidden;
  text-overflow: ellipsis;
}

/* sweep view: the notebook's sweep view (a file of the run log) in a sandboxed frame */
.jp-jdist-sweepview {
  display: flex;
  flex-direction: column;
  background: var(--jp-layout-color1);
  color: var(--jp-ui-font-color1);
  font-family: var(--jp-ui-font-family);
  font-size: var(--jp-ui-font-size1);
  padding: 12px 16px;
}

.jp-jdist-sweep-frame {
  flex: 1 1 auto;
  width: 100%;
  min-height: 400px;
  margin-top: 8px;
  border: 1px solid var(--jp-border-color2);
  background: #fff;
}

/* run view */
.jp-jdist-runview {
  background: var(--jp-layout-color1);
  color: var(--jp-ui-font-color1);
  font-family: var(--jp-ui-font-family);
  font-size: var(--jp-ui-font-size1);
  padding: 12px 16px;
  overflow: auto;
}

.jp-jdist-runview-title {
  display: flex;
  align-items: center;
  gap: 8px;
  font-size: var(--jp-ui-font-size3);
  font-weight: 600;
}

.jp-jdist-runview-head .jp-jdist-meta {
  font-size: var(--jp-ui-font-size1);
  margin-top: 4px;
}

.jp-jdist-progress {
  height: 6px;
  margin: 8px 0 2px;
  border-radius: 3px;
  background: var(--jp-layout-color3);
  overflow: hidden;
  max-width: 640px;
}

.jp-jdist-progress-bar {
  height: 100%;
  background: var(--jp-brand-color1);
}

.jp-jdist-details {
  margin-top: 8px;
}

.jp-jdist-details summary {
  cursor: pointer;
  color: var(--jp-ui-font-color2);
  font-weight: 600;
}

.jp-jdist-summary,
.jp-jdist-code {
  background: var(--jp-layout-color2);
  padding: 8px;
  border-radius: 3px;
  white-space: pre-wrap;
  color: var(--jp-content-font-color1);
}
`,""]),t.d(o,{},{A:s})},314(r){r.exports=function(r){var o=[];return o.toString=function(){return this.map(function(o){var t="",e=void 0!==o[5];return o[4]&&(t+="@supports (".concat(o[4],") {")),o[2]&&(t+="@media ".concat(o[2]," {")),e&&(t+="@layer".concat(o[5].length>0?" ".concat(o[5]):""," {")),t+=r(o),e&&(t+="}"),o[2]&&(t+="}"),o[4]&&(t+="}"),t}).join("")},o.i=function(r,t,e,i,a){"string"==typeof r&&(r=[[null,r,void 0]]);var p={};if(e)for(var n=0;n<this.length;n++){var s=this[n][0];null!=s&&(p[s]=!0)}for(var d=0;d<r.length;d++){var l=[].concat(r[d]);e&&p[l[0]]||(void 0!==a&&(void 0===l[5]||(l[1]="@layer".concat(l[5].length>0?" ".concat(l[5]):""," {").concat(l[1],"}")),l[5]=a),t&&(l[2]&&(l[1]="@media ".concat(l[2]," {").concat(l[1],"}")),l[2]=t),i&&(l[4]?(l[1]="@supports (".concat(l[4],") {").concat(l[1],"}"),l[4]=i):l[4]="".concat(i)),o.push(l))}},o}},601(r){r.exports=function(r){return r[1]}},72(r){var o=[];function t(r){for(var t=-1,e=0;e<o.length;e++)if(o[e].identifier===r){t=e;break}return t}function e(r,e){for(var i={},a=[],p=0;p<r.length;p++){var n=r[p],s=e.base?n[0]+e.base:n[0],d=i[s]||0,l="".concat(s," ").concat(d);i[s]=d+1;var j=t(l),c={css:n[1],media:n[2],sourceMap:n[3],supports:n[4],layer:n[5]};if(-1!==j)o[j].references++,o[j].updater(c);else{var u=function(r,o){var t=o.domAPI(o);return t.update(r),function(o){o?(o.css!==r.css||o.media!==r.media||o.sourceMap!==r.sourceMap||o.supports!==r.supports||o.layer!==r.layer)&&t.update(r=o):t.remove()}}(c,e);e.byIndex=p,o.splice(p,0,{identifier:l,updater:u,references:1})}a.push(l)}return a}r.exports=function(r,i){var a=e(r=r||[],i=i||{});return function(r){r=r||[];for(var p=0;p<a.length;p++){var n=t(a[p]);o[n].references--}for(var s=e(r,i),d=0;d<a.length;d++){var l=t(a[d]);0===o[l].references&&(o[l].updater(),o.splice(l,1))}a=s}}},659(r){var o={};r.exports=function(r,t){var e=function(r){if(void 0===o[r]){var t=document.querySelector(r);if(window.HTMLIFrameElement&&t instanceof window.HTMLIFrameElement)try{t=t.contentDocument.head}catch(r){t=null}o[r]=t}return o[r]}(r);if(!e)throw Error("Couldn't find a style target. This probably means that the value for the 'insert' parameter is invalid.");e.appendChild(t)}},540(r){r.exports=function(r){var o=document.createElement("style");return r.setAttributes(o,r.attributes),r.insert(o,r.options),o}},56(r,o,t){r.exports=function(r){var o=t.nc;o&&r.setAttribute("nonce",o)}},206(r){r.exports=function(r){if("u"<typeof document)return{update:function(){},remove:function(){}};var o=r.insertStyleElement(r);return{update:function(t){var e,i,a;e="",t.supports&&(e+="@supports (".concat(t.supports,") {")),t.media&&(e+="@media ".concat(t.media," {")),(i=void 0!==t.layer)&&(e+="@layer".concat(t.layer.length>0?" ".concat(t.layer):""," {")),e+=t.css,i&&(e+="}"),t.media&&(e+="}"),t.supports&&(e+="}"),(a=t.sourceMap)&&"u">typeof btoa&&(e+="\n/*# sourceMappingURL=data:application/json;base64,".concat(btoa(unescape(encodeURIComponent(JSON.stringify(a))))," */")),r.styleTagTransform(e,o,r.options)},remove:function(){var r;null===(r=o).parentNode||r.parentNode.removeChild(r)}}}},113(r){r.exports=function(r,o){if(o.styleSheet)o.styleSheet.cssText=r;else{for(;o.firstChild;)o.removeChild(o.firstChild);o.appendChild(document.createTextNode(r))}}},959(r,o,t){var e=t(72),i=t.n(e),a=t(206),p=t.n(a),n=t(659),s=t.n(n),d=t(56),l=t.n(d),j=t(540),c=t.n(j),u=t(113),f=t.n(u),v=t(646),b={};b.styleTagTransform=f(),b.setAttributes=l(),b.insert=s().bind(null,"head"),b.domAPI=p(),b.insertStyleElement=c(),i()(v.A,b),v.A&&v.A.locals&&v.A.locals}}]);