import { LabIcon } from '@jupyterlab/ui-components';

import iconSvg from '../style/icon.svg';

/** The sidebar tab icon: ranks connected to each other (themed with jp-icon3). */
export const jdistIcon = new LabIcon({ name: 'jdist:distributed', svgstr: iconSvg });
