from trainhub.services.culler.service import main

if __name__ == "__main__":
    main()
