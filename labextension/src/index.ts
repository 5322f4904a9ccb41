/**
 * jdist's JupyterLab extension: the "Distributed" left sidebar, the run view and the sweep view.
 */
import { ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette, MainAreaWidget, WidgetTracker } from '@jupyterlab/apputils';

import { RunView, createRunWidget } from './runview';
import { DistributedSidebar } from './sidebar';
import { SweepView, createSweepWidget } from './sweepview';

const OPEN_RUN = 'jdist:open-run';
const OPEN_SWEEP = 'jdist:open-sweep';
const SHOW_SIDEBAR = 'jdist:show-sidebar';

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'jdist:plugin',
  description: 'Clusters, ranks and live runs of jdist (distributed PyTorch in Jupyter).',
  autoStart: true,
  optional: [ILayoutRestorer, ICommandPalette],
  activate: (app: JupyterFrontEnd, restorer: ILayoutRestorer | null, palette: ICommandPalette | null) => {
    const tracker = new WidgetTracker<MainAreaWidget<RunView>>({ namespace: 'jdist-run' });

    app.commands.addCommand(OPEN_RUN, {
      label: args => (args.runId ? `Open jdist run ${args.runId}` : 'Open jdist run'),
      execute: args => {
        const runId = String(args.runId ?? '');
        if (!runId) {
          return;
        }
        const existing = tracker.find(w => w.content.runId === runId);
        if (existing) {
          app.shell.activateById(existing.id);
          return existing;
        }
        const widget = createRunWidget(runId);
        void tracker.add(widget);
        app.shell.add(widget, 'main');
        app.shell.activateById(widget.id);
        return widget;
      }
    });

    const sweeps = new WidgetTracker<MainAreaWidget<SweepView>>({ namespace: 'jdist-sweep' });
    app.commands.addCommand(OPEN_SWEEP, {
      label: args => (args.name ? `Open jdist sweep ${args.name}` : 'Open jdist sweep'),
      execute: args => {
        const name = String(args.name ?? '');
        if (!name) {
          return;
        }
        const existing = sweeps.find(w => w.content.name === name);
        if (existing) {
          app.shell.activateById(existing.id);
          return existing;
        }
        const widget = createSweepWidget(name);
        void sweeps.add(widget);
        app.shell.add(widget, 'main');
        app.shell.activateById(widget.id);
        return widget;
      }
    });

    const sidebar = new DistributedSidebar(
      runId => void app.commands.execute(OPEN_RUN, { runId }),
      name => void app.commands.execute(OPEN_SWEEP, { name })
    );
    app.shell.add(sidebar, 'left', { rank: 900 });

    app.commands.addCommand(SHOW_SIDEBAR, {
      label: 'Show the Distributed sidebar (jdist)',
      execute: () => app.shell.activateById(sidebar.id)
    });
    palette?.addItem({ command: SHOW_SIDEBAR, category: 'jdist' });

    if (restorer) {
      restorer.add(sidebar, 'jdist-sidebar');
      void restorer.restore(tracker, {
        command: OPEN_RUN,
        args: w => ({ runId: w.content.runId }),
        name: w => w.content.runId
      });
      void restorer.restore(sweeps, {
        command: OPEN_SWEEP,
        args: w => ({ name: w.content.name }),
        name: w => w.content.name
      });
    }
  }
};

export default plugin;
