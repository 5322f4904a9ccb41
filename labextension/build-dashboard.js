// Runs rspack with dashboard.config.js (node build-dashboard.js, after tsc).
const { rspack } = require('@rspack/core');
rspack(require('./dashboard.config.js'), (err, stats) => {
  if (err || stats.hasErrors()) {
    console.error(err || stats.toString({ colors: false }));
    process.exit(1);
  }
  console.log(stats.toString({ colors: false, modules: false }).split('\n').slice(0, 4).join('\n'));
});
