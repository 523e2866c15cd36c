'use strict';
// The trace types the dashboard draws (page_scripts.TRACES; tests/test_dashboard.py checks the
// two agree, and the browser tests that every graph on every page uses only these).
var Plotly = require('plotly.js/lib/core');     // scatter, shapes, annotations, legends, hover, modebar

Plotly.register([
    require('plotly.js/lib/bar'),
    require('plotly.js/lib/box'),
    require('plotly.js/lib/heatmap'),
    require('plotly.js/lib/scattergl'),
]);

module.exports = Plotly;
