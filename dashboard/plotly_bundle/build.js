// Builds plotly-syncviz.min.js: plotly.js with the trace types of entry.js only, with the options of
// plotly.js's own esbuild-config.js (its custom-bundle task), minified.
//
//   cd dashboard/plotly_bundle && npm install && npm run build
//
// Rebuild it when plotly.js in package.json changes: it must be the version the plotly Python
// package ships (plotly.offline.get_plotlyjs_version()); page_scripts.py serves Dash's full
// plotly.min.js instead where they differ.
const esbuild = require('esbuild');
const { environmentPlugin } = require('esbuild-plugin-environment');
const { glsl } = require('esbuild-plugin-glsl');
const InlineCSSPlugin = require('esbuild-plugin-inline-css');
const version = require('plotly.js/package.json').version;

esbuild.build({
    entryPoints: ['./entry.js'],
    outfile: 'plotly-syncviz.min.js',
    format: 'iife',
    globalName: 'Plotly',
    bundle: true,
    minify: true,
    sourcemap: false,
    legalComments: 'none',
    banner: { js: `/* plotly.js v${version} (MIT license, Copyright 2012-2026 Plotly, Inc.): syncviz's partial bundle, dashboard/plotly_bundle/build.js */` },
    plugins: [InlineCSSPlugin(), glsl({ minify: true }), environmentPlugin({ NODE_DEBUG: false })],
    alias: { regl: '@plotly/regl', stream: 'stream-browserify' },
    define: { global: 'window', 'define.amd': 'false' },
    target: 'es2016',
    logLevel: 'info',
}).catch(() => process.exit(1));
