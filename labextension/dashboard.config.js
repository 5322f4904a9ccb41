// Bundles src/notebook.ts (compiled by tsc into lib/notebook.js) into one ES module for the
// notebook's live dashboard: jdist/kernel/dashboard/charts.js (tools/build_labextension.sh runs it).
const path = require('path');

module.exports = {
  mode: 'production',
  entry: './lib/notebook.js',
  target: ['web', 'es2020'],
  experiments: { outputModule: true },
  output: {
    path: path.resolve(__dirname, '../jdist/kernel/dashboard'),
    filename: 'charts.js',
    module: true,
    library: { type: 'module' },
    clean: false
  },
  devtool: false,
  optimization: { minimize: true }
};
