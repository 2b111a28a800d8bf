/**
 * The part of `@jupyterlab/scheduler` (jupyter-scheduler 2.12's lab extension) this extension uses: the token of the
 * Create Job form's "advanced options" component and its props. Declared here rather than installed (npm has no 2.12
 * of it); at run time the module is the scheduler extension's own, from the shared scope (package.json
 * `sharedPackages`, not bundled), so the token is the one its form asks for.
 */
declare module '@jupyterlab/scheduler' {
  import type { Token } from '@lumino/coreutils';
  import type * as React from 'react';

  export namespace Scheduler {
    type EnvironmentParameterValue = string | number | boolean;
    type ErrorsType = { [key: string]: string };

    /** The fields of the form's model this extension reads and writes. */
    interface IJobModel {
      environment?: string;
      computeType?: string;
      runtimeEnvironmentParameters?: { [key: string]: EnvironmentParameterValue };
      [key: string]: unknown;
    }

    interface IAdvancedOptionsProps {
      /** jupyter-scheduler's JobsView (a numeric enum in 2.12): 1 CreateForm, 2 CreateFromJobDescriptionForm and
       * 7 EditJobDefinition edit; 5 JobDetail and 6 JobDefinitionDetail show */
      jobsView: number;
      model: IJobModel;
      handleModelChange: (model: IJobModel) => void;
      errors: ErrorsType;
      handleErrorsChange: (errors: ErrorsType) => void;
    }

    type IAdvancedOptions = React.FC<IAdvancedOptionsProps>;
    const IAdvancedOptions: Token<IAdvancedOptions>;
  }
}
