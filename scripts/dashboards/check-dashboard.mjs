#!/usr/bin/env node
// Validates a Grafana dashboard JSON against Grafana's published TypeScript types
// (@grafana/schema: Dashboard, Panel, and each panel plugin's Options/FieldConfig) by
// compiling `const d = <json> satisfies Dashboard` with tsc (excess-property and type checks),
// plus a few house rules (every panel has a description, ids unique, variables present).
//
// usage: node check-dashboard.mjs <dashboard.json>
// env:   GPU_LEDGER_NODE_CACHE = dir whose node_modules has @grafana/schema and typescript
//        (scripts/test-dashboards.sh installs them there, outside the repository).
// exit:  0 valid, 1 invalid, 2 usage / missing tooling.
import { readFileSync, writeFileSync, mkdtempSync, rmSync, existsSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { spawnSync } from 'node:child_process';

const file = process.argv[2];
if (!file) { console.error('usage: check-dashboard.mjs <dashboard.json>'); process.exit(2); }
const cache = process.env.GPU_LEDGER_NODE_CACHE;
if (!cache || !existsSync(join(cache, 'node_modules/@grafana/schema/package.json'))
    || !existsSync(join(cache, 'node_modules/typescript/bin/tsc'))) {
  console.error(`ERROR: @grafana/schema and typescript not found under GPU_LEDGER_NODE_CACHE=${cache}`);
  process.exit(2);
}

const errors = [];
let d;
try { d = JSON.parse(readFileSync(file, 'utf8')); } catch (e) { console.error(`${file}: not JSON: ${e.message}`); process.exit(1); }

// ---- house rules ---------------------------------------------------------------------------
const PANEL_TYPES = {
  timeseries: 'timeseries/panelcfg/x/TimeSeriesPanelCfg_types.gen',
  table: 'table/panelcfg/x/TablePanelCfg_types.gen',
  stat: 'stat/panelcfg/x/StatPanelCfg_types.gen',
  bargauge: 'bargauge/panelcfg/x/BarGaugePanelCfg_types.gen',
};
if (typeof d.schemaVersion !== 'number' || d.schemaVersion < 39) errors.push(`schemaVersion must be a number >= 39, got ${JSON.stringify(d.schemaVersion)}`);
if (!d.uid || !d.title) errors.push('dashboard needs uid and title');
const HAS_FIELD_CONFIG = new Set(['timeseries', 'table']);
const vars = Object.fromEntries((d.templating?.list ?? []).map(v => [v.name, v]));
if (vars.datasource?.type !== 'datasource' || vars.datasource?.query !== 'prometheus') errors.push('variable "datasource" must be a prometheus datasource variable');
for (const [n, metricRe] of [['namespace', /label_values\(gpu_ledger_\w+, *namespace\)/], ['node', /label_values\(gpu_ledger_\w+, *node\)/]]) {
  const v = vars[n];
  const q = typeof v?.query === 'string' ? v.query : v?.query?.query;
  if (v?.type !== 'query' || !metricRe.test(q ?? '')) errors.push(`variable "${n}" must be a query variable label_values(gpu_ledger_*, ${n})`);
}
const ids = new Set();
const panels = d.panels ?? [];
if (panels.length === 0) errors.push('no panels');
for (const p of panels) {
  const where = `panel ${p.id} "${p.title}"`;
  if (ids.has(p.id)) errors.push(`${where}: duplicate id`);
  ids.add(p.id);
  if (!PANEL_TYPES[p.type]) errors.push(`${where}: panel type ${p.type} not covered by this checker`);
  if (typeof p.description !== 'string' || p.description.trim().length < 20) errors.push(`${where}: needs a description saying what question it answers`);
  if (!p.gridPos) errors.push(`${where}: no gridPos`);
  if (p.datasource?.uid !== '${datasource}') errors.push(`${where}: datasource must be \${datasource}`);
  if (!Array.isArray(p.targets) || p.targets.length === 0) errors.push(`${where}: no targets`);
  for (const t of p.targets ?? []) {
    if (typeof t.expr !== 'string' || !t.expr.trim()) errors.push(`${where}: target ${t.refId} has no expr`);
    if (typeof t.refId !== 'string') errors.push(`${where}: target without refId`);
    if (t.datasource?.uid !== '${datasource}') errors.push(`${where}: target ${t.refId} datasource must be \${datasource}`);
  }
}

// ---- Grafana's published types, via tsc ------------------------------------------------------
const lit = v => JSON.stringify(v, null, 1);
let ts = `import type { Dashboard, Panel, FieldConfig, FieldConfigSource } from '@grafana/schema';\n`;
for (const [t, path] of Object.entries(PANEL_TYPES)) {
  // stat and bargauge publish no custom FieldConfig
  const fc = HAS_FIELD_CONFIG.has(t) ? `, FieldConfig as ${t}FieldConfig` : '';
  ts += `import type { Options as ${t}Options${fc} } from '@grafana/schema/dist/esm/raw/composable/${path}';\n`;
  if (!fc) ts += `type ${t}FieldConfig = Record<string, unknown>;\n`;
}
ts += `
// JSON carries enum values as strings: accept an enum's string values (\`\${E}\`) everywhere.
type Json<T> = T extends string ? T | \`\${T}\` : T extends Array<infer U> ? Array<Json<U>>
  : T extends object ? { [K in keyof T]: Json<T[K]> } : T;
type Typed<O, F> = Json<Omit<Panel, 'options' | 'fieldConfig'> & {
  options?: Partial<O>;
  fieldConfig?: { defaults: Omit<FieldConfig, 'custom'> & { custom?: Partial<F> }; overrides: FieldConfigSource['overrides'] };
}>;
export const dashboard = ${lit(d)} satisfies Json<Dashboard>;
`;
panels.forEach((p, i) => {
  const t = PANEL_TYPES[p.type] ? p.type : 'timeseries';
  ts += `export const panel_${i} = ${lit(p)} satisfies Typed<${t}Options, ${t}FieldConfig>;\n`;
});
const dir = mkdtempSync(join(resolve(cache), 'check-'));
try {
  writeFileSync(join(dir, 'dashboard.ts'), ts);
  writeFileSync(join(dir, 'tsconfig.json'), JSON.stringify({
    compilerOptions: { strict: true, noEmit: true, target: 'ES2022', module: 'ESNext',
      moduleResolution: 'bundler', skipLibCheck: true, exactOptionalPropertyTypes: false },
    files: ['dashboard.ts'],
  }));
  const r = spawnSync(process.execPath, [join(cache, 'node_modules/typescript/bin/tsc'), '-p', dir], { encoding: 'utf8' });
  if (r.status !== 0) {
    const lines = (r.stdout + r.stderr).split('\n').filter(Boolean);
    errors.push(`does not type-check against @grafana/schema (${lines.length} tsc lines):\n    ` + lines.slice(0, 20).join('\n    '));
  }
} finally {
  if (process.env.GPU_LEDGER_KEEP_TS) console.error(`kept ${dir}`); else rmSync(dir, { recursive: true, force: true });
}

if (errors.length) {
  console.error(`${file}: INVALID`);
  for (const e of errors) console.error(`  - ${e}`);
  process.exit(1);
}
console.log(`${file}: valid (${panels.length} panels, schemaVersion ${d.schemaVersion}, @grafana/schema types)`);
