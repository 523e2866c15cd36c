// WebGL plots (the Replay's timeline of many rows: views/timeline.py GL_ROWS) drawn at the
// screen's own pixel ratio, not Plotly's default of 2 (config plotGlPixelRatio). At 2 a screen of
// ratio 1 gets four times the pixels drawn and scaled down. In headless Chromium, which draws WebGL
// in software, redrawing the 1,024-rank ZeRO-3 step's timeline (benchmarks/scale.py's 10^8-event
// run) took 104-109 ms at ratio 2 and 80 ms at 1 (session 36, the page's own figures redrawn 12
// times each, twice). A screen of ratio 2 still gets 2. Plotly loads on its own schedule, so the
// default is set the moment window.Plotly is assigned, before any figure is drawn.
(function () {
    var ratio = Math.min(4, Math.max(1, window.devicePixelRatio || 1));
    function apply(P) {
        if (P && P.setPlotConfig) { P.setPlotConfig({plotGlPixelRatio: ratio}); }
    }
    if (window.Plotly) { apply(window.Plotly); return; }
    var held;
    Object.defineProperty(window, "Plotly", {
        configurable: true, enumerable: true,
        get: function () { return held; },
        set: function (value) { held = value; apply(value); }
    });
})();
